"""Build report.json's content from every results/<cell>/: per cell, its status, resolutions, tests,
benchmark, kernels, accuracy and expectations, as the report's schema (gdn.matrix.schema.Report) has them.

Cells named in the matrix but without a results directory are reported as not run, with what they need
(gdn.matrix.devices), so a report always shows the whole matrix; results of cells the matrix no longer
names are kept, since they were run. What a cell that did not run would have shown is "not checked",
never "not met".

A cell's status is the worst of what its files show, not cell.json's word alone: a failed or errored
test in junit.xml or tests.jsonl, a junit.xml missing or empty where the cell got to its tests, an exit
code that says otherwise, a file that does not validate (a NaN among them) each make it worse, with
the reason. Each failure carries the label its reruns gave it (reruns.json, gdn.matrix.reruns), or
not_rerun where none are recorded; a cell is flaky only when cell.json says so and reruns.json labels
every failing test flaky.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gdn.backends import fla_choices
from gdn.matrix import devices, kernel_report, runs, schema, speed
from gdn.matrix.config import Cell, Matrix
from gdn.matrix.outcomes import FILE as OUTCOMES
from gdn.matrix.outcomes import FinishedTest
from gdn.matrix.report_text import UNMARKED_FAMILY, failed_so_far
from gdn.matrix.reruns import FILE as RERUNS
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
from gdn.matrix.schema import (
    REPORT_SCHEMA,
    BenchFile,
    CellOutcome,
    Expectation,
    Failure,
    FailureRerun,
    FamilyCounts,
    KernelCount,
    Rejection,
    Report,
    ReportCell,
    RerunsFile,
    ResolutionEntry,
    ResolutionRecord,
    Verdict,
)
from gdn.matrix.versions import dig, versions
from gdn.op_names import OP_NAMES

NEVER_RUN = "no results: never run"
# statuses of a cell that never got to its tests: what they would have shown is not known
NOT_RAN = ("not_run", "build_failed", "interrupted")
# a cell's status in torch_npu's per-file vocabulary: no result is MISSING, a run that broke is CRASHED
VERDICTS: dict[str, Verdict] = {
    "passed": "PASSED",
    # tests failed: that each passed on a rerun is the report's word, not a pass
    "flaky": "FAILED",
    "failed": "FAILED",
    "error": "CRASHED",
    "build_failed": "CRASHED",
    "timeout": "TIMEOUT",
    "not_run": "MISSING",
    "interrupted": "MISSING",
}


def _resolution_entry(record: ResolutionRecord) -> ResolutionEntry:
    if record.error is not None:
        return ResolutionEntry(error=record.error)
    rejected = [Rejection(r.backend, r.reason) for r in record.rejected]
    passed_over = [Rejection(r.backend, r.reason) for r in record.not_candidates]
    return ResolutionEntry(record.backend, record.route, rejected, passed_over)


def _op_order(op: str) -> tuple[int, str]:
    return (OP_NAMES.index(op) if op in OP_NAMES else len(OP_NAMES), op)


def resolution_map(records: list[ResolutionRecord]) -> dict[str, dict[str, ResolutionEntry]]:
    by_op: dict[str, dict[str, ResolutionEntry]] = {}
    for record in records:
        by_op.setdefault(record.op, {})[record.device] = _resolution_entry(record)
    return {op: by_op[op] for op in sorted(by_op, key=_op_order)}


def family_order(family: str) -> tuple[int, str]:
    return (FAMILY_MARKERS.index(family) if family in FAMILY_MARKERS else len(FAMILY_MARKERS), family)


def family_counts(tests: list[TestCase]) -> dict[str, FamilyCounts]:
    counts: dict[str, FamilyCounts] = {}
    for test in tests:
        family = counts.setdefault(test.family or UNMARKED_FAMILY, FamilyCounts())
        setattr(family, test.outcome, getattr(family, test.outcome) + 1)
        family.total += 1
    return {name: counts[name] for name in sorted(counts, key=family_order)}


def failures(tests: list[TestCase], finished: list[FinishedTest], reruns: RerunsFile | None) -> list[Failure]:
    """The failed and errored tests, each with the kernels its calls ran and the seed it drew where
    tests.jsonl has them (its lines as written, read here as the kernel log's records), and the label
    its reruns gave it."""
    ran = {_test_name(test_case(t)): t.kernels for t in finished if t.kernels}
    seeds = {_test_name(test_case(t)): t.seed for t in finished if t.seed is not None}
    rerun = {_node_name(r.test): r for r in reruns.failures} if reruns else {}
    shown = []
    for t in tests:
        if t.outcome not in ("failed", "error"):
            continue
        name = _test_name(t)
        record = rerun.get(name) or _not_rerun(reruns)
        shown.append(
            Failure(
                test=name,
                outcome=t.outcome,
                family=t.family,
                message=t.message,
                kernels=schema.load(list[KernelCount], json.dumps(ran.get(name) or []), OUTCOMES),
                seed=seeds.get(name, record.seed),
                label=record.label,
                label_reason=record.reason,
                reruns=record.attempts,
            )
        )
    return shown


def _not_rerun(reruns: RerunsFile | None) -> FailureRerun:
    reason = f"not among the reruns of {RERUNS}" if reruns else f"no {RERUNS}"
    return FailureRerun("", "failed", "not_rerun", reason=reason)


def _test_name(t: TestCase) -> str:
    return f"{t.classname}::{t.name}"


def _node_name(nodeid: str) -> str:
    """A pytest node id as the report names a test (JUnit's class and name)."""
    return _test_name(test_case(FinishedTest(nodeid=nodeid, outcome="failed")))


def bench_rows(bench: BenchFile | None, problems: list[str]) -> list[dict[str, Any]] | None:
    if bench is None:
        return None
    rows = [row.to_json() if hasattr(row, "to_json") else asdict(row) for row in bench.rows]
    problems += speed.row_problems(rows)
    return rows


def _kind(device: str | None) -> devices.DeviceKind | None:
    """The device kind, or None for one this version does not know (results of a newer one)."""
    return devices.KINDS.get(device or "")


def accelerator_kind(device: str | None) -> devices.DeviceKind | None:
    kind = _kind(device)
    return kind if kind is not None and kind.accelerator else None


def primary_device(device: str | None, resolution: dict[str, dict[str, ResolutionEntry]]) -> str:
    """The torch device of the cell's accelerator where it resolved ops on one, else cpu (e.g. an NPU
    cell run without the NPU visible has cpu records only); a cell that resolved nothing keeps its own.
    A cpu cell that ran on a machine with an accelerator (the host cell on a GPU box) is shown there:
    that is where its kernels ran."""
    kind = _kind(device)
    if not resolution:
        return kind.torch_type if kind else device or "cpu"
    accelerator = accelerator_kind(device)
    if accelerator is None and kind is not None:
        seen = {torch_type for per_device in resolution.values() for torch_type in per_device}
        accelerator = next((k for k in devices.KINDS.values() if k.accelerator and k.torch_type in seen), None)
    if accelerator and any(accelerator.torch_type in per_device for per_device in resolution.values()):
        return accelerator.torch_type
    return "cpu"


def expectations(cell: Cell | None, shown: ReportCell) -> list[Expectation]:
    """Each expected resolution with what resolved; ok is None (not checked) where the cell resolved
    nothing: a cell that did not run has shown neither that it meets them nor that it does not."""
    if cell is None:
        return []
    device = primary_device(shown.device, shown.resolution)
    ran = shown.status not in NOT_RAN and bool(shown.resolution)
    checked = []
    for expect in cell.expect:
        actual = shown.resolution.get(expect.op, {}).get(device)
        backend, route = (actual.backend, actual.route) if actual is not None else (None, None)
        ok = (backend == expect.backend and expect.route in (None, route)) if ran else None
        checked.append(Expectation(expect.op, expect.backend, expect.route, backend, route, ok))
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
    if outcome is None or outcome.status not in ("passed", "flaky", "failed"):
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
    if outcome.status == "flaky":
        # failures are what a flaky cell has: each must be one its reruns labelled flaky
        found += _not_flaky(results)
    elif junit_bad:
        found.append(("failed", f"{JUNIT} has {junit_bad}"))
    elif recorded_bad:
        found.append(("failed", f"{OUTCOMES} has {recorded_bad}"))
    found.append((status_of(outcome.exit_code), f"its exit code is {outcome.exit_code}"))
    return [(status, what) for status, what in found if STATUS_RANK[status] > STATUS_RANK[outcome.status]]


def _not_flaky(results: CellResults) -> list[tuple[str, str]]:
    """A flaky cell's failures that its reruns did not label flaky, or that it shows none."""
    shown = failures(results.tests or results.recorded, results.finished, results.reruns)
    if not shown:
        return [("failed", "it shows no failing test")]
    other = [f for f in shown if f.label != "flaky"]
    if not other:
        return []
    return [("failed", f"{RERUNS} does not label {other[0].test} flaky ({other[0].label})")]


def flaky_reason(shown: list[Failure]) -> str:
    count = len(shown)
    return f"{count} failing test{'s' * (count != 1)}, each passed on a rerun with its own seed (flaky)"


def _status(results: CellResults, problems: list[str]) -> tuple[str, str | None]:
    outcome = results.outcome
    if outcome is None:
        if results.interrupted is not None and not results.invalid:
            return "interrupted", results.interrupted.reason + failed_so_far(results.interrupted.tests_failed)
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
    if outcome.status == "flaky":
        return "flaky", outcome.reason or flaky_reason(failures(results.tests, results.finished, results.reruns))
    return outcome.status, outcome.reason


def _never_run(cell: Cell) -> CellResults:
    reason = f"{NEVER_RUN}; {devices.needs_text(cell.device, cell.runtime)}"
    outcome = CellOutcome(cell=cell.name, status="not_run", device=cell.device, runtime=cell.runtime, reason=reason)
    return CellResults(name=cell.name, outcome=outcome)


def cards(device: str | None, manifest: dict[str, Any] | None) -> list[str]:
    """The names of the cards of the cell's kind its probe saw (e.g. NVIDIA H200)."""
    accelerator = accelerator_kind(device)
    found = dig(manifest, "devices", accelerator.torch_type, "devices") if accelerator else None
    return [str(d["name"]) for d in found or [] if isinstance(d, dict) and d.get("name")]


def cell_entry(results: CellResults, cell: Cell | None) -> ReportCell:
    problems = list(results.problems)
    resolution = resolution_map(results.resolution)
    bench = bench_rows(results.bench, problems)
    # last, so that it sees every problem found while reading the cell
    status, reason = _status(results, problems)
    known = results.outcome
    device = (known.device if known else None) or (cell.device if cell else None)
    shown = ReportCell(
        name=results.name,
        status=status,
        reason=reason,
        verdict=VERDICTS[status],
        device=device,
        runtime=(known.runtime if known else None) or (cell.runtime if cell else None),
        matrix_runtime=(known.matrix_runtime if known else None) or (cell.runtime if cell else None),
        # whether the tests ran on the real device: unknown (None) for a cell that never ran them
        real_hardware=None if status in NOT_RAN else bool(known and known.real_hardware),
        cards=cards(device, results.manifest),
        stand_ins=list(known.stand_ins) if known else [],
        duration_s=known.duration_s if known else None,
        image=known.image if known else None,
        image_built=known.image_built if known else None,
        exit_code=known.exit_code if known else None,
        log_tail=known.log_tail if known else None,
        lock=known.lock if known else None,
        versions=versions(results.manifest),
        pin_differences=known.pin_differences if known else None,
        resolution=resolution,
        families=family_counts(results.tests),
        failures=failures(results.tests, results.finished, results.reruns),
        bench=bench,
        peer_kernels={"fla": fla_choices.fla_kernel(results.manifest)},
        kernels=kernel_report.cell_kernels(results.kernels),
        comparisons=kernel_report.comparisons(results.finished),
        accuracy=results.accuracy,
        problems=problems,
        interrupted=results.interrupted,
    )
    shown.expectations = expectations(cell, shown)
    return shown


def _is_report_dir(directory: Path) -> bool:
    """A report written under the results root (nox keeps it in results/report/) is not a cell."""
    return (directory / "report.json").is_file() and not (directory / "cell.json").exists()


def build_report(results_root: Path, matrix: Matrix | None = None) -> Report:
    """The report of `results_root`; a run that died with its marker left (and whose cell no live run
    holds) is recorded first, as the next run of its cell would."""
    if results_root.is_dir():
        runs.clear_every_dead_run(results_root)
    found = {r.name: r for r in read_results(results_root) if not _is_report_dir(results_root / r.name)}
    cells = [cell_entry(found.pop(c.name, None) or _never_run(c), c) for c in (matrix.cells if matrix else ())]
    cells += [cell_entry(found[name], None) for name in sorted(found)]
    return Report(REPORT_SCHEMA, datetime.now(timezone.utc).isoformat(timespec="seconds"), list(OP_NAMES), cells)
