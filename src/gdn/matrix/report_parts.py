"""How each part of a report's cell reads on its pages, report.md and report.html alike: its card, lock,
runtime, pins, resolutions, test families, hardware and interrupted runs."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gdn.matrix.report_build import NOT_RAN, accelerator_kind, family_order, primary_device
from gdn.matrix.report_text import UNMARKED_FAMILY, failed_so_far
from gdn.matrix.results import FAMILY_MARKERS
from gdn.matrix.versions import VERSION_KEYS


def duration_text(seconds: Any) -> str | None:
    return f"{seconds:.0f} s" if isinstance(seconds, (int, float)) else None


def cell_primary_device(cell: dict[str, Any]) -> str:
    return primary_device(cell.get("device"), cell.get("resolution") or {})


def accelerator_missing(cell: dict[str, Any]) -> bool:
    """An accelerator cell whose resolutions are cpu ones: its device was not visible where it ran."""
    return accelerator_kind(cell.get("device")) is not None and cell_primary_device(cell) == "cpu"


def card_text(cell: dict[str, Any]) -> str | None:
    """`NVIDIA H200`, or `8 × NVIDIA H200`: the cards the cell ran on."""
    counted = Counter(cell.get("cards") or [])
    return ", ".join(name if n == 1 else f"{n} × {name}" for name, n in counted.items()) or None


def lock_text(cell: dict[str, Any]) -> str | None:
    """The start of the lock's digest, enough to tell two images' package sets apart at a glance."""
    lock = cell.get("lock")
    digest = lock.get("digest") if isinstance(lock, dict) else None
    return digest.removeprefix("sha256:")[:12] if isinstance(digest, str) else None


def runtime_text(cell: dict[str, Any]) -> str | None:
    """The runtime the cell ran in, and matrix.yaml's where that is another."""
    runtime, own = cell.get("runtime"), cell.get("matrix_runtime")
    return f"{runtime} (matrix.yaml: {own})" if own and runtime != own else runtime


def pin_text(cell: dict[str, Any], difference: dict[str, Any]) -> str:
    """`host torch 2.11.0, cell pins 2.13.0`."""
    where = "host" if cell.get("runtime") == "host" else "image"
    return f"{where} {difference.get('package')} {difference.get('found')}, cell pins {difference.get('pinned')}"


def expectation_state(expect: dict[str, Any]) -> str:
    return {True: "met", False: "not met"}.get(expect.get("ok"), "not checked")


def route_text(entry: dict[str, Any] | None) -> str:
    """`eager (triton rejected)`: the route that serves the op, and what it fell back from."""
    if not entry:
        return "—"
    if entry.get("error"):
        return "error"
    text = entry.get("route") or entry.get("backend") or "?"
    rejected = [r.get("backend") or "?" for r in entry.get("rejected") or []]
    return f"{text} ({', '.join(rejected)} rejected)" if rejected else text


def not_candidates_text(cell: dict[str, Any]) -> str:
    """Why the backends that never became candidates on the cell's device were not tried, each
    reason once: `fla: serves cuda, npu, not cpu; triton: auto tries it on cuda, npu only; ...`."""
    device = cell_primary_device(cell)
    reasons: dict[str, list[str]] = {}
    for per_device in (cell.get("resolution") or {}).values():
        for passed_over in (per_device.get(device) or {}).get("not_candidates") or []:
            seen = reasons.setdefault(passed_over.get("backend") or "?", [])
            if passed_over.get("reason") not in seen:
                seen.append(passed_over.get("reason"))
    return "; ".join(f"{backend}: {', '.join(map(str, why))}" for backend, why in reasons.items())


def status_text(status: str) -> str:
    """A cell's status as the report's readers see it, one word per state: `not run`, `build failed`."""
    return status.replace("_", " ")


def resolution_state(entry: dict[str, Any] | None) -> str:
    """none / error / fallback / eager / kernel: the colour of a resolution cell."""
    if not entry:
        return "none"
    if entry.get("error"):
        return "error"
    if entry.get("rejected"):
        return "fallback"
    return "eager" if entry.get("backend") == "eager" else "kernel"


def family_text(counts: dict[str, int] | None, status: str) -> str:
    if status == "not_run":
        return "not run"
    if not counts:
        return "—"
    ran = counts["total"] - counts["skipped"]
    text = f"{counts['passed']}/{ran}"
    return text + (f" ({counts['skipped']} skipped)" if counts["skipped"] else "")


def family_state(counts: dict[str, int] | None, status: str) -> str:
    """passed / failed / not_run / empty: the colour of a family cell."""
    if status == "not_run":
        return "not_run"
    if not counts or counts["total"] == counts["skipped"]:
        return "empty"
    return "failed" if counts["failed"] + counts["error"] else "passed"


def report_families(report: dict[str, Any]) -> list[str]:
    """The families to show: the markers, and any other family that ran a test somewhere. Unmarked
    records that are only skips are the collection-time skips of modules a cell cannot import (no
    triton, no transformers): no test of any family, so they get no column."""
    seen = {
        family
        for cell in report["cells"]
        for family, counts in (cell.get("families") or {}).items()
        if family != UNMARKED_FAMILY or counts["total"] > counts["skipped"]
    }
    return sorted(set(FAMILY_MARKERS) | seen, key=family_order)


def version_columns(report: dict[str, Any]) -> list[str]:
    """The version keys any cell has a value for (a CPU-only matrix has no CANN column)."""
    return [key for key in VERSION_KEYS if any((c.get("versions") or {}).get(key) for c in report["cells"])]


def hardware_note(cell: dict[str, Any]) -> str | None:
    # a cell that never got to run its tests ran them on nothing, real or not
    if accelerator_kind(cell.get("device")) is None or cell.get("real_hardware") or cell["status"] in NOT_RAN:
        return None
    stand_ins = cell.get("stand_ins") or []
    if stand_ins:
        return f"not run on real {cell['device']} hardware; stand-ins: {', '.join(stand_ins)}"
    return f"not run on real {cell['device']} hardware"


def interrupted_text(cell: dict[str, Any]) -> str | None:
    """A later run that was interrupted, or whose runner died, beside the complete one the cell shows."""
    record = cell.get("interrupted")
    if not record:
        return None
    how = "died" if record.get("runner_died") else f"was interrupted by {record['signal']}"
    text = f"a later run {how} at {record['interrupted_at']}: {record['reason']}"
    return text + failed_so_far(record)
