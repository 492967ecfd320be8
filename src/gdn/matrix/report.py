"""Merge every results/<cell>/ into one matrix report: report.json (the source of truth, versioned
schema), report.md (sized for a GitHub job summary) and report.html (one self-contained page).

Cells named in the matrix but without a results directory are reported as not run, with what they need
(gdn.matrix.devices), so a report always shows the whole matrix; results of cells the matrix no longer
names are kept, since they were run. What a cell that did not run would have shown is "not checked",
never "not met".

A cell's status is the worst of what its files show, not cell.json's word alone: a failed or errored
test in junit.xml or tests.jsonl, a junit.xml missing or empty where the cell got to its tests, an exit
code that says otherwise, a file that does not validate (a NaN among them) each make it worse, with
the reason. report.json is strict JSON; report.md stays within what a GitHub job summary takes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from gdn.backends import fla_choices
from gdn.matrix import accuracy_report, devices, kernel_report, peers, runs, schema, speed
from gdn.matrix.accuracy.table import error_text
from gdn.matrix.config import Cell, Matrix, MatrixConfigError, default_matrix_path, load_matrix
from gdn.matrix.jsonio import atomic_write
from gdn.matrix.markdown import cut, fit_summary, md_cell, md_table
from gdn.matrix.outcomes import FILE as OUTCOMES
from gdn.matrix.outcomes import FinishedTest
from gdn.matrix.results import (
    FAMILY_MARKERS,
    JUNIT,
    STATUS_RANK,
    CellResults,
    TestCase,
    read_results,
    status_of,
    test_case,
)
from gdn.matrix.schema import REPORT_SCHEMA, BenchFile, CellOutcome, ResolutionRecord, Verdict
from gdn.matrix.versions import VERSION_KEYS, dig, versions
from gdn.op_names import OP_NAMES

NEVER_RUN = "no results: never run"
# statuses of a cell that never got to its tests: what they would have shown is not known
NOT_RAN = ("not_run", "build_failed", "interrupted")
# a cell's status in torch_npu's per-file vocabulary: no result is MISSING, a run that broke is CRASHED
VERDICTS: dict[str, Verdict] = {
    "passed": "PASSED",
    "failed": "FAILED",
    "error": "CRASHED",
    "build_failed": "CRASHED",
    "timeout": "TIMEOUT",
    "not_run": "MISSING",
    "interrupted": "MISSING",
}
UNMARKED_FAMILY = "unmarked"
FAILURES_SHOWN = 20
# a cell's problems and notes in report.md (report.json has them all)
NOTES_SHOWN = 20
LOG_LINE_CHARS = 500
# an interrupted run's failed tests named in its one-line reason
FAILED_SHOWN = 5
# the page has room for more than a job summary, but a broken stack can fail thousands of grid tests
HTML_FAILURES_SHOWN = 200
LOG_LINES_SHOWN = 40
TEMPLATE = "report.html.j2"


# ---------------------------------------------------------------- report.json


def _resolution_entry(record: ResolutionRecord) -> dict[str, Any]:
    if record.error is not None:
        return {"backend": None, "route": None, "error": record.error}
    rejected = [{"backend": r.backend, "reason": r.reason} for r in record.rejected]
    passed_over = [{"backend": r.backend, "reason": r.reason} for r in record.not_candidates]
    return {"backend": record.backend, "route": record.route, "rejected": rejected, "not_candidates": passed_over}


def _op_order(op: str) -> tuple[int, str]:
    return (OP_NAMES.index(op) if op in OP_NAMES else len(OP_NAMES), op)


def resolution_map(records: list[ResolutionRecord]) -> dict[str, dict[str, dict[str, Any]]]:
    by_op: dict[str, dict[str, dict[str, Any]]] = {}
    for record in records:
        by_op.setdefault(record.op, {})[record.device] = _resolution_entry(record)
    return {op: by_op[op] for op in sorted(by_op, key=_op_order)}


def _family_order(family: str) -> tuple[int, str]:
    return (FAMILY_MARKERS.index(family) if family in FAMILY_MARKERS else len(FAMILY_MARKERS), family)


def family_counts(tests: list[TestCase]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for test in tests:
        family = counts.setdefault(
            test.family or UNMARKED_FAMILY, {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "total": 0}
        )
        family[test.outcome] += 1
        family["total"] += 1
    return {name: counts[name] for name in sorted(counts, key=_family_order)}


def failures(tests: list[TestCase], finished: list[FinishedTest]) -> list[dict[str, Any]]:
    """The failed and errored tests, each with the kernels its calls ran where tests.jsonl has them."""
    ran = {_test_name(test_case(t)): t.kernels for t in finished if t.kernels}
    return [
        {
            "test": _test_name(t),
            "family": t.family,
            "outcome": t.outcome,
            "message": t.message,
            "kernels": ran.get(_test_name(t)) or [],
        }
        for t in tests
        if t.outcome in ("failed", "error")
    ]


def _test_name(t: TestCase) -> str:
    return f"{t.classname}::{t.name}"


def bench_rows(bench: BenchFile | None, problems: list[str]) -> list[dict[str, Any]] | None:
    if bench is None:
        return None
    rows = [row.to_json() if hasattr(row, "to_json") else asdict(row) for row in bench.rows]
    problems += speed.row_problems(rows)
    return rows


def _kind(device: str | None) -> devices.DeviceKind | None:
    """The device kind, or None for one this version does not know (results of a newer one)."""
    return devices.KINDS.get(device or "")


def _accelerator(device: str | None) -> devices.DeviceKind | None:
    kind = _kind(device)
    return kind if kind is not None and kind.accelerator else None


def primary_device(device: str | None, resolution: dict[str, dict[str, Any]]) -> str:
    """The torch device of the cell's accelerator where it resolved ops on one, else cpu (e.g. an NPU
    cell run without the NPU visible has cpu records only); a cell that resolved nothing keeps its own.
    A cpu cell that ran on a machine with an accelerator (the host cell on a GPU box) is shown there:
    that is where its kernels ran."""
    kind = _kind(device)
    if not resolution:
        return kind.torch_type if kind else device or "cpu"
    accelerator = _accelerator(device)
    if accelerator is None and kind is not None:
        seen = {torch_type for per_device in resolution.values() for torch_type in per_device}
        accelerator = next((k for k in devices.KINDS.values() if k.accelerator and k.torch_type in seen), None)
    if accelerator and any(accelerator.torch_type in per_device for per_device in resolution.values()):
        return accelerator.torch_type
    return "cpu"


def expectations(cell: Cell | None, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Each expected resolution with what resolved; ok is None (not checked) where the cell resolved
    nothing: a cell that did not run has shown neither that it meets them nor that it does not."""
    if cell is None:
        return []
    device = primary_device(entry["device"], entry["resolution"])
    ran = entry["status"] not in NOT_RAN and bool(entry["resolution"])
    checked = []
    for expect in cell.expect:
        actual = entry["resolution"].get(expect.op, {}).get(device, {})
        backend, route = actual.get("backend"), actual.get("route")
        ok = (backend == expect.backend and expect.route in (None, route)) if ran else None
        checked.append(
            {
                "op": expect.op,
                "backend": expect.backend,
                "route": expect.route,
                "actual_backend": backend,
                "actual_route": route,
                "ok": ok,
            }
        )
    return checked


def _tally(failed: int, errored: int) -> str:
    """`1 failed test`, `2 tests in error`, `1 failed test and 1 in error`."""
    parts = [f"{failed} failed test{'s' * (failed != 1)}"] if failed else []
    if errored:
        parts.append(f"{errored} in error" if failed else f"{errored} test{'s' * (errored != 1)} in error")
    return " and ".join(parts)


def _bad_tests(tests: list[TestCase]) -> str | None:
    failed = sum(t.outcome == "failed" for t in tests)
    errored = sum(t.outcome == "error" for t in tests)
    return _tally(failed, errored) if failed or errored else None


def contradictions(results: CellResults) -> list[tuple[str, str]]:
    """(the status it shows, what) for each thing the cell's files show against cell.json's status: a
    cell that got to its tests (passed, failed) has a junit.xml with tests in it, no failed or errored
    test if it passed, and the exit code of its status."""
    outcome = results.outcome
    if outcome is None or outcome.status not in ("passed", "failed"):
        return []
    found = []
    unreadable = next((problem for problem in results.problems if problem.startswith(JUNIT)), None)
    if not results.junit_found:
        found.append(("error", f"{JUNIT} is missing"))
    elif unreadable:
        found.append(("error", unreadable))
    elif not results.tests:
        found.append(("error", f"{JUNIT} holds no test"))
    junit_bad = _bad_tests(results.tests) if results.junit_found else None
    recorded_bad = _bad_tests(results.recorded)
    if junit_bad:
        found.append(("failed", f"{JUNIT} has {junit_bad}"))
    elif recorded_bad:
        found.append(("failed", f"{OUTCOMES} has {recorded_bad}"))
    found.append((status_of(outcome.exit_code), f"its exit code is {outcome.exit_code}"))
    return [(status, what) for status, what in found if STATUS_RANK[status] > STATUS_RANK[outcome.status]]


def _status(results: CellResults, problems: list[str]) -> tuple[str, str | None]:
    outcome = results.outcome
    if outcome is None:
        if results.interrupted is not None and not results.invalid:
            return "interrupted", results.interrupted.reason + failed_so_far(asdict(results.interrupted))
        first = problems[0] if problems else "cell.json is missing"
        return "error", f"invalid results: {first}" if first in results.invalid else first
    if results.invalid:
        # a file that does not validate: what it held is unknown, so the cell cannot have passed
        return "error", f"invalid results: {results.invalid[0]}"
    against = contradictions(results)
    if against:
        worst = max((status for status, _ in against), key=STATUS_RANK.__getitem__)
        return worst, f"cell.json says {outcome.status} but " + " and ".join(what for _, what in against)
    if outcome.status == "passed" and problems:
        # what cannot be read cannot be shown to have passed
        return "error", f"results unreadable: {problems[0]}"
    return outcome.status, outcome.reason


def _never_run(cell: Cell) -> CellResults:
    reason = f"{NEVER_RUN}; {devices.needs_text(cell.device, cell.runtime)}"
    outcome = CellOutcome(cell=cell.name, status="not_run", device=cell.device, runtime=cell.runtime, reason=reason)
    return CellResults(name=cell.name, outcome=outcome)


def cards(device: str | None, manifest: dict[str, Any] | None) -> list[str]:
    """The names of the cards of the cell's kind its probe saw (e.g. NVIDIA H200)."""
    accelerator = _accelerator(device)
    found = dig(manifest, "devices", accelerator.torch_type, "devices") if accelerator else None
    return [str(d["name"]) for d in found or [] if isinstance(d, dict) and d.get("name")]


def cell_entry(results: CellResults, cell: Cell | None) -> dict[str, Any]:
    problems = list(results.problems)
    resolution = resolution_map(results.resolution)
    bench = bench_rows(results.bench, problems)
    # last, so that it sees every problem found while reading the cell
    status, reason = _status(results, problems)
    known = asdict(results.outcome) if results.outcome is not None else {}
    device = known.get("device") or (cell.device if cell else None)
    entry: dict[str, Any] = {
        "name": results.name,
        "status": status,
        "reason": reason,
        "verdict": VERDICTS[status],
        "device": device,
        "runtime": known.get("runtime") or (cell.runtime if cell else None),
        "matrix_runtime": known.get("matrix_runtime") or (cell.runtime if cell else None),
        # whether the tests ran on the real device: unknown (None) for a cell that never ran them
        "real_hardware": None if status in NOT_RAN else bool(known.get("real_hardware", False)),
        "cards": cards(device, results.manifest),
        "stand_ins": list(known.get("stand_ins") or []),
        "duration_s": known.get("duration_s"),
        "image": known.get("image"),
        "image_built": known.get("image_built"),
        "exit_code": known.get("exit_code"),
        "log_tail": known.get("log_tail"),
        "lock": known.get("lock"),
        "versions": versions(results.manifest),
        "pin_differences": known.get("pin_differences"),
        "resolution": resolution,
        "families": family_counts(results.tests),
        "failures": failures(results.tests, results.finished),
        "bench": bench,
        "peer_kernels": {"fla": fla_choices.fla_kernel(results.manifest)},
        "kernels": kernel_report.cell_kernels(results.kernels),
        "comparisons": kernel_report.comparisons(results.finished),
        "accuracy": None if results.accuracy is None else asdict(results.accuracy),
    }
    entry["expectations"] = expectations(cell, entry)
    entry["problems"] = problems
    entry["interrupted"] = asdict(results.interrupted) if results.interrupted is not None else None
    return entry


def _is_report_dir(directory: Path) -> bool:
    """A report written under the results root (nox keeps it in results/report/) is not a cell."""
    return (directory / "report.json").is_file() and not (directory / "cell.json").exists()


def build_report(results_root: Path, matrix: Matrix | None = None) -> dict[str, Any]:
    """The report of `results_root`; a run that died with its marker left (and whose cell no live run
    holds) is recorded first, as the next run of its cell would."""
    if results_root.is_dir():
        runs.clear_every_dead_run(results_root)
    found = {r.name: r for r in read_results(results_root) if not _is_report_dir(results_root / r.name)}
    cells = [cell_entry(found.pop(c.name, None) or _never_run(c), c) for c in (matrix.cells if matrix else ())]
    cells += [cell_entry(found[name], None) for name in sorted(found)]
    return {
        "schema": REPORT_SCHEMA,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "ops": list(OP_NAMES),
        "cells": cells,
    }


# ---------------------------------------------------------------- shared by md and html


def cell_primary_device(cell: dict[str, Any]) -> str:
    return primary_device(cell.get("device"), cell.get("resolution") or {})


def accelerator_missing(cell: dict[str, Any]) -> bool:
    """An accelerator cell whose resolutions are cpu ones: its device was not visible where it ran."""
    return _accelerator(cell.get("device")) is not None and cell_primary_device(cell) == "cpu"


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
    return sorted(set(FAMILY_MARKERS) | seen, key=_family_order)


def version_columns(report: dict[str, Any]) -> list[str]:
    """The version keys any cell has a value for (a CPU-only matrix has no CANN column)."""
    return [key for key in VERSION_KEYS if any((c.get("versions") or {}).get(key) for c in report["cells"])]


def hardware_note(cell: dict[str, Any]) -> str | None:
    # a cell that never got to run its tests ran them on nothing, real or not
    if _accelerator(cell.get("device")) is None or cell.get("real_hardware") or cell["status"] in NOT_RAN:
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


def failed_so_far(record: dict[str, Any]) -> str:
    """The failed tests an interrupted run had finished, the first few by name."""
    failed = record.get("tests_failed") or []
    if not failed:
        return ""
    more = len(failed) - FAILED_SHOWN
    return f" (failed: {'; '.join(failed[:FAILED_SHOWN])}{f'; and {more} more' if more > 0 else ''})"


def expectation_text(expect: dict[str, Any]) -> str:
    wanted = expect["backend"] + (f" ({expect['route']})" if expect.get("route") else "")
    if expect.get("actual_backend") is None:
        return f"{expect['op']}: expected {wanted}, nothing resolved"
    return f"{expect['op']}: expected {wanted}, resolved {expect['actual_backend']} ({expect.get('actual_route')})"


# ---------------------------------------------------------------- report.md

STATUS_ICONS = {
    "passed": "✅",
    "failed": "❌",
    "error": "💥",
    "timeout": "⏱️",
    "build_failed": "🧱",
    "not_run": "⚪",
    "interrupted": "⏹️",
}


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks inside the text."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _duration(seconds: Any) -> str | None:
    return f"{seconds:.0f} s" if isinstance(seconds, (int, float)) else None


def _md_summary(report: dict[str, Any]) -> list[str]:
    rows = [
        [
            c["name"],
            f"{STATUS_ICONS.get(c['status'], '')} {status_text(c['status'])}",
            c.get("device"),
            card_text(c),
            runtime_text(c),
            lock_text(c),
            _duration(c.get("duration_s")),
            c.get("reason"),
        ]
        for c in report["cells"]
    ]
    header = ["cell", "status", "device", "card", "runtime", "lock", "duration", "reason"]
    return ["## Cells", "", *md_table(header, rows)]


def _md_resolution(report: dict[str, Any]) -> list[str]:
    rows, off_device = [], False
    for cell in report["cells"]:
        device = cell_primary_device(cell)
        marker = ""
        if accelerator_missing(cell):
            marker, off_device = " †", True
        routes = [route_text((cell.get("resolution") or {}).get(op, {}).get(device)) for op in report["ops"]]
        rows.append([f"{cell['name']} ({device}){marker}", *routes, not_candidates_text(cell) or None])
    lines = ["## Resolved backends", "", *md_table(["cell", *report["ops"], "not candidates"], rows)]
    if off_device:
        lines += ["† the cell's accelerator was not visible: these are its cpu resolutions.", ""]
    return lines


def _md_families(report: dict[str, Any]) -> list[str]:
    families = report_families(report)
    icons = {"passed": " ✅", "failed": " ❌"}
    rows = []
    for cell in report["cells"]:
        counts = cell.get("families") or {}
        row = [cell["name"]]
        for family in families:
            state = family_state(counts.get(family), cell["status"])
            row.append(family_text(counts.get(family), cell["status"]) + icons.get(state, ""))
        rows.append(row)
    return ["## Tests", "", *md_table(["cell", *families], rows)]


def _md_versions(report: dict[str, Any]) -> list[str]:
    columns = version_columns(report)
    if not columns:
        return []
    rows = [[c["name"], *((c.get("versions") or {}).get(k) for k in columns)] for c in report["cells"]]
    return ["## Versions", "", *md_table(["cell", *columns], rows)]


def _md_pins(report: dict[str, Any]) -> list[str]:
    """Cells that ran outside their image, or whose environment lacked a pin: what they ran is not what
    the cell pins, and their results are read with that in mind."""
    lines = []
    for cell in report["cells"]:
        differences = cell.get("pin_differences")
        outside = cell.get("matrix_runtime") not in (None, cell.get("runtime")) and cell["status"] not in NOT_RAN
        if not (differences or outside):
            continue
        head = f"- **{cell['name']}**" + (f" (runtime {runtime_text(cell)})" if outside else "")
        if differences is None:
            text = "pins not compared: no manifest"
        else:
            text = "; ".join(pin_text(cell, d) for d in differences) or "every pin matches"
        lines.append(f"{head}: {md_cell(text)}")
    return ["## Differences from the pins", "", *lines, ""] if lines else []


def _md_not_run(report: dict[str, Any]) -> list[str]:
    cells = [c for c in report["cells"] if c["status"] == "not_run"]
    if not cells:
        return []
    return ["## Not run", "", *(f"- **{c['name']}**: {md_cell(c.get('reason'))}" for c in cells), ""]


def _md_notes(report: dict[str, Any]) -> list[str]:
    """Per cell: problems, unmet expectations, stand-in hardware."""
    lines = []
    for cell in report["cells"]:
        notes = [f"problem: {p}" for p in cell.get("problems") or []]
        if cell["status"] != "not_run":
            unmet = [e for e in cell.get("expectations") or [] if e["ok"] is False]
            notes += [f"expectation not met: {expectation_text(e)}" for e in unmet]
        if note := hardware_note(cell):
            notes.append(note)
        if cell["status"] != "interrupted" and (note := interrupted_text(cell)):
            notes.append(note)
        lines += [f"- **{cell['name']}**: {md_cell(n)}" for n in notes[:NOTES_SHOWN]]
        if len(notes) > NOTES_SHOWN:
            lines.append(f"- **{cell['name']}**: … and {len(notes) - NOTES_SHOWN} more (see report.json)")
    return ["## Problems", "", *lines, ""] if lines else []


def _md_failures(report: dict[str, Any]) -> list[str]:
    lines = []
    for cell in report["cells"]:
        failed = cell.get("failures") or []
        if not failed:
            continue
        lines += [f"### {cell['name']}: {len(failed)} failing", ""]
        for f in failed[:FAILURES_SHOWN]:
            message = f": {md_cell(f['message'])[:300]}" if f.get("message") else ""
            lines.append(f"- `{f['test']}` ({f['outcome']}){message}")
            ran = kernel_report.shown(f.get("kernels"))
            lines += [f"  - ran: {md_cell(kernel_report.kernel_line(k))}" for k in ran]
        if len(failed) > FAILURES_SHOWN:
            lines.append(f"- … and {len(failed) - FAILURES_SHOWN} more (see report.json)")
        lines.append("")
    return ["## Failures", "", *lines] if lines else []


def _md_logs(report: dict[str, Any]) -> list[str]:
    lines = []
    for cell in report["cells"]:
        tail = cell.get("log_tail")
        if not tail or cell["status"] == "passed":
            continue
        text = "\n".join(cut(line, LOG_LINE_CHARS) for line in tail.splitlines()[-LOG_LINES_SHOWN:])
        fence = _fence(text)
        lines += [f"<details><summary>{cell['name']}: log tail</summary>", "", fence, text, fence, "", "</details>", ""]
    return ["## Logs", "", *lines] if lines else []


def _md_comparisons(report: dict[str, Any]) -> list[str]:
    return kernel_report.comparisons_markdown(report["cells"])


def _md_kernels(report: dict[str, Any]) -> list[str]:
    return kernel_report.peers_markdown(report["cells"])


def _md_accuracy(report: dict[str, Any]) -> list[str]:
    return accuracy_report.markdown(report["cells"])


def render_markdown(report: dict[str, Any]) -> str:
    lines = ["# gdn-matrix report", "", f"Generated {report['generated_at']}.", ""]
    for section in (
        _md_summary,
        _md_resolution,
        peers.markdown,
        _md_families,
        _md_comparisons,
        _md_versions,
        speed.markdown,
        _md_accuracy,
        _md_pins,
        _md_not_run,
        _md_notes,
        _md_failures,
        _md_kernels,
        _md_logs,
    ):
        lines += section(report)
    return fit_summary("\n".join(lines).rstrip() + "\n", "report is in report.json and report.html")


# ---------------------------------------------------------------- report.html


def _shape_text(shape: Any) -> str:
    if isinstance(shape, (list, tuple)):
        return "×".join(str(s) for s in shape)
    if isinstance(shape, dict):
        return ", ".join(f"{k}={v}" for k, v in shape.items())
    return "" if shape is None else str(shape)


def bench_label(row: dict[str, Any]) -> str:
    backend = row.get("backend") or row.get("impl", "?")
    parts = [str(row.get("op", "?")), str(backend), _shape_text(row.get("shape")), str(row.get("pass") or "")]
    return " · ".join(p for p in parts if p)


def _timed(rows: list[dict[str, Any]]) -> list[tuple[str, float]]:
    timed = []
    for row in rows:
        ms = row.get("ms")
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and math.isfinite(ms) and ms >= 0:
            timed.append((bench_label(row), float(ms)))
    return timed


def bench_svg(rows: list[dict[str, Any]] | None) -> str | None:
    """Horizontal bars of each benchmark row's time, labelled, on one linear ms scale."""
    from markupsafe import escape

    timed = _timed(rows or [])
    if not timed:
        return None
    bar_h, gap, label_w, plot_w, value_w = 18, 6, 380, 420, 90
    longest = max(ms for _, ms in timed) or 1.0
    height = len(timed) * (bar_h + gap) + gap
    width = label_w + plot_w + value_w
    parts = [
        f'<svg class="bench" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="op timings in ms">'
    ]
    for i, (label, ms) in enumerate(timed):
        y = gap + i * (bar_h + gap)
        bar = max(1.0, plot_w * ms / longest)
        text_y = y + bar_h - 5
        parts += [
            f'<text x="{label_w - 8}" y="{text_y}" text-anchor="end">{escape(label)}</text>',
            f'<rect x="{label_w}" y="{y}" width="{bar:.1f}" height="{bar_h}"><title>{escape(label)}: {ms:.4g} ms'
            "</title></rect>",
            f'<text x="{label_w + bar + 6:.1f}" y="{text_y}">{ms:.3g} ms</text>',
        ]
    parts.append("</svg>")
    return "".join(parts)


def _html_environment():
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["route_text"] = route_text
    env.filters["duration"] = _duration
    env.globals.update(
        family_text=family_text,
        family_state=family_state,
        resolution_state=resolution_state,
        hardware_note=hardware_note,
        interrupted_text=interrupted_text,
        expectation_text=expectation_text,
        expectation_state=expectation_state,
        card_text=card_text,
        status_text=status_text,
        not_candidates_text=not_candidates_text,
        runtime_text=runtime_text,
        lock_text=lock_text,
        pin_text=pin_text,
        primary_device=cell_primary_device,
        accelerator_missing=accelerator_missing,
        shown_kernels=kernel_report.shown,
        kernel_line=kernel_report.kernel_line,
        comparison_text=kernel_report.comparison_text,
        peer_dispatch=kernel_report.peer_dispatch,
        accuracy_case=accuracy_report.case,
        accuracy_peers=accuracy_report.peers,
        accuracy_worst=accuracy_report.worst_name,
        error_text=error_text,
    )
    return env


def render_html(report: dict[str, Any]) -> str:
    from markupsafe import Markup

    source = resources.files("gdn.matrix").joinpath("templates", TEMPLATE).read_text(encoding="utf-8")
    template = _html_environment().from_string(source)
    # built from escaped parts in bench_svg, speed.html and accuracy_report.svg, so marked safe here and nowhere else
    plots = {c["name"]: Markup(svg) for c in report["cells"] if (svg := bench_svg(c.get("bench")))}
    speed_tables = {c["name"]: Markup(table) for c in report["cells"] if (table := speed.html(c))}
    accuracy_plots = {c["name"]: Markup(svg) for c in report["cells"] if (svg := accuracy_report.svg(c))}
    counts: dict[str, int] = {}
    for cell in report["cells"]:
        counts[cell["status"]] = counts.get(cell["status"], 0) + 1
    return template.render(
        report=report,
        families=report_families(report),
        version_columns=version_columns(report),
        plots=plots,
        speed_tables=speed_tables,
        accuracy_plots=accuracy_plots,
        status_counts=counts,
        failures_shown=HTML_FAILURES_SHOWN,
    )


def write_report(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html"}
    # render everything before writing anything, so a rendering bug cannot leave a mixed set; the
    # report is checked against its model first, so that diff can read every report this writes
    # strict JSON: every number in it was read from a file that had to be strict JSON too
    text = json.dumps(report, indent=2, allow_nan=False) + "\n"
    schema.load(schema.Report, text, "report.json")
    markdown, html = render_markdown(report), render_html(report)
    atomic_write(paths["json"], text)
    atomic_write(paths["md"], markdown)
    atomic_write(paths["html"], html)
    return paths


# ---------------------------------------------------------------- gdn-matrix report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    parser.add_argument(
        "--matrix", type=Path, help="matrix.yaml naming the cells (default: $GDN_MATRIX, else ./matrix.yaml if present)"
    )
    parser.add_argument(
        "--output", type=Path, metavar="DIR", help="where to write the report (default: the results root's report/)"
    )


def _matrix(path: Path | None) -> Matrix | None:
    if path is None:
        path = default_matrix_path()
        if not path.exists():
            return None
    return load_matrix(path)


def run(args: argparse.Namespace) -> int:
    try:
        matrix = _matrix(args.matrix)
    except MatrixConfigError as exc:
        print(f"gdn-matrix report: error: {exc}", file=sys.stderr)
        return 2
    try:
        report = build_report(args.results, matrix)
    except FileNotFoundError as exc:
        print(f"gdn-matrix report: error: {exc}", file=sys.stderr)
        return 2
    paths = write_report(report, args.output or args.results / "report")
    for path in paths.values():
        print(path)
    return 0
