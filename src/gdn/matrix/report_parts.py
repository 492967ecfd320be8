"""How each part of a report's cell reads on its pages, report.md and report.html alike: its card, lock,
runtime, pins, resolutions, test families, hardware and interrupted runs."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gdn.matrix.report_build import NOT_RAN, accelerator_kind, family_order, primary_device
from gdn.matrix.report_text import UNMARKED_FAMILY, failed_so_far
from gdn.matrix.results import FAMILY_MARKERS
from gdn.matrix.schema import Expectation, FamilyCounts, PinDifference, Report, ReportCell, ResolutionEntry
from gdn.matrix.versions import VERSION_KEYS


def duration_text(seconds: Any) -> str | None:
    return f"{seconds:.0f} s" if isinstance(seconds, (int, float)) else None


def cell_primary_device(cell: ReportCell) -> str:
    return primary_device(cell.device, cell.resolution)


def accelerator_missing(cell: ReportCell) -> bool:
    """An accelerator cell whose resolutions are cpu ones: its device was not visible where it ran."""
    return accelerator_kind(cell.device) is not None and cell_primary_device(cell) == "cpu"


def card_text(cell: ReportCell) -> str | None:
    """`NVIDIA H200`, or `8 × NVIDIA H200`: the cards the cell ran on."""
    counted = Counter(cell.cards)
    return ", ".join(name if n == 1 else f"{n} × {name}" for name, n in counted.items()) or None


def lock_text(cell: ReportCell) -> str | None:
    """The start of the lock's digest, enough to tell two images' package sets apart at a glance."""
    return cell.lock.digest.removeprefix("sha256:")[:12] if cell.lock is not None else None


def runtime_text(cell: ReportCell) -> str | None:
    """The runtime the cell ran in, and matrix.yaml's where that is another."""
    runtime, own = cell.runtime, cell.matrix_runtime
    return f"{runtime} (matrix.yaml: {own})" if own and runtime != own else runtime


def pin_text(cell: ReportCell, difference: PinDifference) -> str:
    """`host torch 2.11.0, cell pins 2.13.0`."""
    where = "host" if cell.runtime == "host" else "image"
    return f"{where} {difference.package} {difference.found}, cell pins {difference.pinned}"


def expectation_state(expect: Expectation) -> str:
    return {True: "met", False: "not met"}.get(expect.ok, "not checked")


def route_text(entry: ResolutionEntry | None) -> str:
    """`eager (triton rejected)`: the route that serves the op, and what it fell back from."""
    if entry is None:
        return "—"
    if entry.error:
        return "error"
    text = entry.route or entry.backend or "?"
    rejected = [r.backend or "?" for r in entry.rejected]
    return f"{text} ({', '.join(rejected)} rejected)" if rejected else text


def not_candidates_text(cell: ReportCell) -> str:
    """Why the backends that never became candidates on the cell's device were not tried, each
    reason once: `fla: serves cuda, npu, not cpu; triton: auto tries it on cuda, npu only; ...`."""
    device = cell_primary_device(cell)
    reasons: dict[str, list[str | None]] = {}
    for per_device in cell.resolution.values():
        entry = per_device.get(device)
        for passed_over in entry.not_candidates if entry is not None else []:
            seen = reasons.setdefault(passed_over.backend or "?", [])
            if passed_over.reason not in seen:
                seen.append(passed_over.reason)
    return "; ".join(f"{backend}: {', '.join(map(str, why))}" for backend, why in reasons.items())


def status_text(status: str) -> str:
    """A cell's status as the report's readers see it, one word per state: `not run`, `build failed`."""
    return status.replace("_", " ")


def resolution_state(entry: ResolutionEntry | None) -> str:
    """none / error / fallback / eager / kernel: the colour of a resolution cell."""
    if entry is None:
        return "none"
    if entry.error:
        return "error"
    if entry.rejected:
        return "fallback"
    return "eager" if entry.backend == "eager" else "kernel"


def family_text(counts: FamilyCounts | None, status: str) -> str:
    if status == "not_run":
        return "not run"
    if counts is None:
        return "—"
    ran = counts.total - counts.skipped
    text = f"{counts.passed}/{ran}"
    return text + (f" ({counts.skipped} skipped)" if counts.skipped else "")


def family_state(counts: FamilyCounts | None, status: str) -> str:
    """passed / failed / not_run / empty: the colour of a family cell."""
    if status == "not_run":
        return "not_run"
    if counts is None or counts.total == counts.skipped:
        return "empty"
    return "failed" if counts.failed + counts.error else "passed"


def report_families(report: Report) -> list[str]:
    """The families to show: the markers, and any other family that ran a test somewhere. Unmarked
    records that are only skips are the collection-time skips of modules a cell cannot import (no
    triton, no transformers): no test of any family, so they get no column."""
    seen = {
        family
        for cell in report.cells
        for family, counts in cell.families.items()
        if family != UNMARKED_FAMILY or counts.total > counts.skipped
    }
    return sorted(set(FAMILY_MARKERS) | seen, key=family_order)


def version_columns(report: Report) -> list[str]:
    """The version keys any cell has a value for (a CPU-only matrix has no CANN column)."""
    return [key for key in VERSION_KEYS if any(c.versions.get(key) for c in report.cells)]


def hardware_note(cell: ReportCell) -> str | None:
    # a cell that never got to run its tests ran them on nothing, real or not
    if accelerator_kind(cell.device) is None or cell.real_hardware or cell.status in NOT_RAN:
        return None
    if cell.stand_ins:
        return f"not run on real {cell.device} hardware; stand-ins: {', '.join(cell.stand_ins)}"
    return f"not run on real {cell.device} hardware"


def interrupted_text(cell: ReportCell) -> str | None:
    """A later run that was interrupted, or whose runner died, beside the complete one the cell shows."""
    record = cell.interrupted
    if record is None:
        return None
    how = "died" if record.runner_died else f"was interrupted by {record.signal}"
    text = f"a later run {how} at {record.interrupted_at}: {record.reason}"
    return text + failed_so_far(record.tests_failed)
