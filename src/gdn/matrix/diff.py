"""Compare two matrix reports (report.json) and say what an upgrade changes: backend resolution per
(cell, op, device), tests that newly fail or no longer fail, cell status, versions, lock changes
package by package, cells added or removed, unmet expectations, benchmark slowdowns per (op, backend,
shape, pass), the fastest backend of each (op, shape, pass), and the kernel each peer itself runs (fla's
own dispatch). `gdn-matrix diff OLD NEW` prints Markdown and exits non-zero when anything is a
regression, so it can gate a wheel upgrade in CI (exit 0: no regression, 1: a regression, 2: the input
is unusable). `--pair OLD_CELL=NEW_CELL` compares two differently named cells instead (the stack in use
against the candidate cell that adds or upgrades a wheel). A lock change is shown, never a regression by itself;
a peer's kernel change regresses only when a slowdown or a resolution loss of its cell comes with it.

A newly failing test regresses when its reruns labelled it deterministic, or did not settle it (not
rerun, or a report without labels); one labelled flaky or seed-dependent is listed as news, and so is a
cell whose status moved to flaky or failed on such failures alone, unless `--gate-flaky`. With
`--history DIR` a benchmark row is judged against its trailing median in the history and that median's
spread where the history has enough reports of it (gdn.matrix.speed_gate), else against the old report.

What the diff cannot read it refuses (exit 2, naming the file and the field) rather than leave out of
the comparison: a report past its size cap or not a regular file, not strict JSON (a NaN), nested past
a limit, not the report.json schema, a timing that is not a finite number of ms above 0.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gdn.backends import fla_choices
from gdn.matrix import accuracy_report, schema, speed, speed_gate
from gdn.matrix.accuracy_report import DEFAULT_FACTOR, AccuracyRegression
from gdn.matrix.accuracy_report import regressions as accuracy_regressions
from gdn.matrix.history_store import HistoryError
from gdn.matrix.jsonio import (
    REPORT_FILE_MAX_BYTES,
    UnreadableFileError,
    atomic_write,
    location,
    parse_json,
    read_capped,
)
from gdn.matrix.kernel_report import ComparisonLoss, KernelCallChange, comparison_losses, kernel_call_changes
from gdn.matrix.markdown import fit_summary, md_cell, md_table
from gdn.matrix.program import Program
from gdn.matrix.report_text import UNMARKED_FAMILY, expectation_text, label_word
from gdn.matrix.results import STATUS_RANK
from gdn.matrix.schema import (
    Expectation,
    Failure,
    FailureLabel,
    Rejection,
    Report,
    ReportCell,
    ResolutionEntry,
    shape_text,
)
from gdn.matrix.speed import bench_index

DEFAULT_THRESHOLD = 0.10
EXIT_OK, EXIT_REGRESSION, EXIT_UNUSABLE = 0, 1, 2
EXIT_CODES = f"""exit status:
  {EXIT_OK}  no regression (or --no-fail)
  {EXIT_REGRESSION}  at least one regression
  {EXIT_UNUSABLE}  unusable input: a report that cannot be read or does not validate against the report.json
     schema (`gdn-matrix schema report`), a NaN, nesting past 64 levels, a timing that is not a
     finite number of ms > 0, two cells of one name, a bad --threshold, a --pair cell that is not
     there, an --output that cannot be written, a --history that is not a directory"""


# an (op, device) a report has no resolution for
NOT_RESOLVED = ResolutionEntry()
# statuses of a cell that ran its probe and its tests: its resolutions are known
GOT_TO_TESTS = ("passed", "flaky", "failed")
# labels of a failure that its reruns showed to pass with its own seed or with another: news, not gated
# by default (a failure not rerun, or from a report without labels, is gated: nothing shows it is not real)
NOT_GATED: tuple[FailureLabel, ...] = ("flaky", "seed_dependent")


class ReportError(ValueError):
    """A report file that cannot be read as a report.json, or a cell it does not have."""


@dataclass
class BackendChange:
    cell: str
    op: str
    device: str
    old_backend: str | None
    old_route: str | None
    new_backend: str | None
    new_route: str | None
    old_error: str | None = None
    new_error: str | None = None
    # why the new resolution passed over its other candidates: the first thing a reader asks
    new_rejected: list[Rejection] = field(default_factory=list)

    @property
    def backend_changed(self) -> bool:
        return self.old_backend != self.new_backend

    @property
    def old_text(self) -> str:
        return _resolved_text(self.old_backend, self.old_route, self.old_error)

    @property
    def new_text(self) -> str:
        return _resolved_text(self.new_backend, self.new_route, self.new_error)

    @property
    def why(self) -> str:
        return "; ".join(f"{r.backend} rejected: {r.reason}" for r in self.new_rejected)


def _resolved_text(backend: str | None, route: str | None, error: str | None) -> str:
    if error:
        return f"error: {error}"
    return route or backend or "not resolved"


@dataclass
class TestChange:
    cell: str
    test: str
    outcome: str
    message: str | None = None
    label: FailureLabel | None = None

    @property
    def label_text(self) -> str:
        return f", {label_word(self.label)}" if self.label else ""


@dataclass
class StatusChange:
    cell: str
    old: str
    new: str
    # the new status is flaky or failed, and on failures labelled flaky or seed-dependent alone
    on_ungated_failures: bool = False

    @property
    def regressed(self) -> bool:
        unknown = STATUS_RANK["error"]
        return STATUS_RANK.get(self.new, unknown) > STATUS_RANK.get(self.old, unknown)

    def gates(self, gate_flaky: bool) -> bool:
        return self.regressed and (gate_flaky or not self.on_ungated_failures)


@dataclass
class VersionChange:
    cell: str
    package: str
    old: str | None
    new: str | None


@dataclass
class LockChange:
    """A cell's lock changed: informational, since what it changes is judged by the tests it runs."""

    cell: str
    old_digest: str
    new_digest: str
    changed: list[tuple[str, str, str]] = field(default_factory=list)
    added: list[tuple[str, str]] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        parts = [f"{name} {old} -> {new}" for name, old, new in self.changed]
        parts += [f"+ {name} {version}" for name, version in self.added]
        parts += [f"- {name} {version}" for name, version in self.removed]
        what = ", ".join(parts) or f"same versions, other files or hashes ({self.old_digest} -> {self.new_digest})"
        return f"cell {self.cell}: lock changed: {what}"


@dataclass
class Slowdown:
    """A row slower than its baseline (`old_ms`: the old report's time, or the history's median) by
    more than it allows; `rule` says which baseline judged it."""

    cell: str
    label: str
    old_ms: float
    new_ms: float
    rule: str = "old report"
    allowed: float = DEFAULT_THRESHOLD

    @property
    def ratio(self) -> float:
        return self.new_ms / self.old_ms - 1.0


@dataclass
class FastestChange:
    cell: str
    group: str  # "op pass (shape)"
    old: str
    new: str


@dataclass
class KernelChange:
    """A peer's own kernel changed (e.g. fla's chunk op: triton -> flash_qla); `speed` is how the peer's
    benchmark rows timed in both reports moved with it; `with_` lists the slowdowns and resolution losses
    of that cell that came with it (then it is a regression)."""

    cell: str
    peer: str
    old: str
    new: str
    speed: list[str] = field(default_factory=list)
    with_: list[str] = field(default_factory=list)


@dataclass
class ReportDiff:
    threshold: float
    gate_flaky: bool = False
    # the history's reports the speed gate reads (the trailing window), and the entries it could not read
    history: list[Report] | None = None
    history_problems: list[str] = field(default_factory=list)
    # how many benchmark rows each rule judged ("median of 7 reports" counted as "trailing median")
    speed_rules: dict[str, int] = field(default_factory=dict)
    backend_changes: list[BackendChange] = field(default_factory=list)
    newly_failing: list[TestChange] = field(default_factory=list)
    newly_passing: list[TestChange] = field(default_factory=list)
    status_changes: list[StatusChange] = field(default_factory=list)
    version_changes: list[VersionChange] = field(default_factory=list)
    lock_changes: list[LockChange] = field(default_factory=list)
    cells_added: list[str] = field(default_factory=list)
    cells_removed: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)
    expectation_violations: list[tuple[str, Expectation]] = field(default_factory=list)
    slowdowns: list[Slowdown] = field(default_factory=list)
    fastest_changes: list[FastestChange] = field(default_factory=list)
    kernel_changes: list[KernelChange] = field(default_factory=list)
    # what the calls of a step ran (kernels.json), per level, function and dtype
    kernel_call_changes: list[KernelCallChange] = field(default_factory=list)
    comparison_losses: list[ComparisonLoss] = field(default_factory=list)
    accuracy_factor: float = DEFAULT_FACTOR
    accuracy_regressions: list[AccuracyRegression] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)

    @property
    def status_regressions(self) -> list[StatusChange]:
        return [c for c in self.status_changes if c.gates(self.gate_flaky)]

    def gated(self, change: TestChange) -> bool:
        return self.gate_flaky or change.label not in NOT_GATED

    @property
    def ungated_failing(self) -> list[TestChange]:
        return [t for t in self.newly_failing if not self.gated(t)]

    def to_markdown(self) -> str:
        return render_markdown(self)


# ---------------------------------------------------------------- comparing


def _cells(report: Report) -> dict[str, ReportCell]:
    return {cell.name: cell for cell in report.cells}


def _paired(
    old: Report, new: Report, pairs: Sequence[tuple[str, str]]
) -> tuple[dict[str, ReportCell], dict[str, ReportCell]]:
    """The old and new cells of each pair under one name, "old → new"."""
    old_cells, new_cells = _cells(old), _cells(new)
    before, after = {}, {}
    for old_name, new_name in pairs:
        for side, name, cells in (("old", old_name, old_cells), ("new", new_name, new_cells)):
            if name not in cells:
                raise ReportError(f"--pair {old_name}={new_name}: the {side} report has no cell {name!r}")
        before[f"{old_name} → {new_name}"] = old_cells[old_name]
        after[f"{old_name} → {new_name}"] = new_cells[new_name]
    return before, after


def _backend_changes(name: str, old: ReportCell, new: ReportCell) -> list[BackendChange]:
    old_res, new_res = old.resolution, new.resolution
    if not old_res or (not new_res and new.status not in GOT_TO_TESTS):
        # a cell that resolved nothing because it never got to its probe (not run, build failed) is
        # told by its status; one that got to its tests and resolved nothing lost every resolution
        return []
    changes = []
    keys = {(op, dev) for res in (old_res, new_res) for op, per_device in res.items() for dev in per_device}
    for op, device in sorted(keys):
        before = old_res.get(op, {}).get(device) or NOT_RESOLVED
        after = new_res.get(op, {}).get(device) or NOT_RESOLVED
        # error texts carry per-run details, so only whether there was one is compared
        if _state(before) == _state(after):
            continue
        changes.append(
            BackendChange(
                name,
                op,
                device,
                before.backend,
                before.route,
                after.backend,
                after.route,
                old_error=before.error,
                new_error=after.error,
                new_rejected=after.rejected,
            )
        )
    return changes


def _state(entry: ResolutionEntry) -> tuple[str | None, str | None, bool]:
    return entry.backend, entry.route, bool(entry.error)


def _is_backend_regression(change: BackendChange, route_changes_regress: bool) -> bool:
    if change.old_backend is None:
        # nothing resolved before (a new device, or an error then too): nothing was lost
        return False
    return change.backend_changed or route_changes_regress


def _failing(cell: ReportCell) -> dict[str, Failure]:
    return {f.test: f for f in cell.failures}


def _ran_family(cell: ReportCell, family: str | None) -> bool:
    counts = cell.families.get(family or UNMARKED_FAMILY)
    return counts is not None and counts.total > counts.skipped


def _test_changes(name: str, old: ReportCell, new: ReportCell) -> tuple[list[TestChange], list[TestChange]]:
    before, after = _failing(old), _failing(new)
    failing = [TestChange(name, t, f.outcome, f.message, f.label) for t, f in after.items() if t not in before]
    # a report lists failures only, so a test counts as passing again only where its family ran
    passing = [
        TestChange(name, t, "passed") for t, f in before.items() if t not in after and _ran_family(new, f.family)
    ]
    return failing, passing


def version_changes(name: str, old: ReportCell, new: ReportCell) -> list[VersionChange]:
    before, after = old.versions, new.versions
    if not any(before.values()) or not any(after.values()):
        # no manifest on one side (not run, build failed): its status says why, not every version
        return []
    return [
        VersionChange(name, key, before.get(key), after.get(key))
        for key in dict.fromkeys([*before, *after])
        if before.get(key) != after.get(key)
    ]


def lock_change(name: str, old: ReportCell, new: ReportCell) -> LockChange | None:
    before, after = old.lock, new.lock
    if before is None or after is None or before.digest == after.digest:
        # a report without locks (older, or a cell without one) has nothing to compare
        return None
    old_packages, new_packages = before.packages, after.packages
    return LockChange(
        name,
        before.digest,
        after.digest,
        changed=[
            (package, old_packages[package], new_packages[package])
            for package in sorted(old_packages.keys() & new_packages.keys())
            if old_packages[package] != new_packages[package]
        ],
        added=[(package, new_packages[package]) for package in sorted(new_packages.keys() - old_packages.keys())],
        removed=[(package, old_packages[package]) for package in sorted(old_packages.keys() - new_packages.keys())],
    )


def _slowdowns(diff: ReportDiff, name: str, old: ReportCell, new: ReportCell) -> list[Slowdown]:
    """The rows of `new` slower than their baseline: the history's trailing median where it has enough
    of the row (the history of the new cell's name), else the old report's time."""
    before, after = bench_index(old), bench_index(new)
    history = speed_gate.trailing_times(diff.history, new.name) if diff.history is not None else None
    found = []
    for key, (label, new_ms) in after.items():
        old_ms = before[key][1] if key in before else None
        judged = speed_gate.judge(old_ms, history.get(key, []) if history is not None else None, diff.threshold)
        if judged is None:
            continue
        rule = "trailing median" if judged.by_history else "old report"
        diff.speed_rules[rule] = diff.speed_rules.get(rule, 0) + 1
        slowdown = Slowdown(name, label, judged.baseline_ms, new_ms, judged.rule, judged.allowed)
        if slowdown.ratio > judged.allowed:
            found.append(slowdown)
    return found


def _fastest(cell: ReportCell) -> dict[str, str]:
    """The fastest timed backend per "op pass (shape)"."""
    best: dict[str, tuple[float, str]] = {}
    rows, _ = speed.parse_rows(cell.bench)
    for row in rows:
        if row.ms is not None:
            group = f"{row.op} {row.pass_} ({shape_text(row.shape)})"
            if group not in best or row.ms < best[group][0]:
                best[group] = (row.ms, row.backend)
    return {group: backend for group, (_, backend) in best.items()}


def _fastest_changes(name: str, old: ReportCell, new: ReportCell) -> list[FastestChange]:
    before, after = _fastest(old), _fastest(new)
    return [FastestChange(name, g, before[g], after[g]) for g in before if g in after and before[g] != after[g]]


def _kernel_changes(name: str, old: ReportCell, new: ReportCell) -> list[KernelChange]:
    # the peers' own sections as the probe wrote them (gdn.backends.fla_choices reads them)
    before, after = old.peer_kernels.get("fla"), new.peer_kernels.get("fla")
    if before is None and after is None:
        return []
    old_text, new_text = fla_choices.kernel_text(before), fla_choices.kernel_text(after)
    if old_text == new_text:
        return []
    timed_before, timed_after = bench_index(old, "fla"), bench_index(new, "fla")
    speed_change = [
        f"{label}: {ms:.3g} → {timed_after[key][1]:.3g} ms ({timed_after[key][1] / ms - 1:+.0%})"
        for key, (label, ms) in timed_before.items()
        if key in timed_after
    ]
    return [KernelChange(name, "fla", old_text, new_text, speed_change)]


def _violations(cell: ReportCell) -> list[tuple[str, Expectation]]:
    if cell.status == "not_run":
        # the cell's status already says it was not run; its expectations were not tested
        return []
    # ok is None where the cell resolved nothing: not checked, so not violated either
    return [(cell.name, e) for e in cell.expectations if e.ok is False]


def _compare_cell(diff: ReportDiff, name: str, old: ReportCell, new: ReportCell) -> None:
    diff.backend_changes += _backend_changes(name, old, new)
    failing, passing = _test_changes(name, old, new)
    diff.newly_failing += failing
    diff.newly_passing += passing
    if old.status != new.status:
        ungated = bool(new.failures) and all(f.label in NOT_GATED for f in new.failures)
        diff.status_changes.append(
            StatusChange(name, old.status, new.status, ungated and new.status in ("flaky", "failed"))
        )
    diff.version_changes += version_changes(name, old, new)
    locked = lock_change(name, old, new)
    if locked is not None:
        diff.lock_changes.append(locked)
    diff.slowdowns += _slowdowns(diff, name, old, new)
    diff.fastest_changes += _fastest_changes(name, old, new)
    diff.kernel_changes += _kernel_changes(name, old, new)
    diff.kernel_call_changes += kernel_call_changes(name, old, new)
    diff.comparison_losses += comparison_losses(name, old, new)
    diff.accuracy_regressions += accuracy_regressions(name, old, new, diff.accuracy_factor)


def _regressions(diff: ReportDiff, route_changes_regress: bool) -> list[str]:
    found = [
        f"{c.cell}: {c.op} on {c.device} moved from {c.old_text} to {c.new_text}" + (f" ({c.why})" if c.why else "")
        for c in diff.backend_changes
        if _is_backend_regression(c, route_changes_regress)
    ]
    found += [f"{t.cell}: {t.test} newly {t.outcome}{t.label_text}" for t in diff.newly_failing if diff.gated(t)]
    found += [f"{c.cell}: status {c.old} → {c.new}" for c in diff.status_regressions]
    found += [f"{name}: cell removed" for name in diff.cells_removed]
    found += [f"{name}: expectation not met: {expectation_text(e)}" for name, e in diff.expectation_violations]
    found += [
        f"{s.cell}: {s.label} slowed {s.ratio:.0%} ({s.old_ms:.3g} ms → {s.new_ms:.3g} ms"
        + (f", against the {s.rule})" if s.rule != "old report" else ")")
        for s in diff.slowdowns
    ]
    for change in diff.kernel_changes:
        # a peer's kernel change is news; it regresses only with a slowdown or a resolution loss beside it
        change.with_ = [f"{s.label} slowed {s.ratio:.0%}" for s in diff.slowdowns if s.cell == change.cell]
        change.with_ += [
            f"{c.op} on {c.device} moved from {c.old_text} to {c.new_text}"
            for c in diff.backend_changes
            if c.cell == change.cell and _is_backend_regression(c, route_changes_regress)
        ]
        if change.with_:
            found.append(
                f"{change.cell}: {change.peer}'s kernel changed ({change.old} → {change.new}) with "
                + "; ".join(change.with_)
            )
    found += [loss.text() for loss in diff.comparison_losses]
    found += [f"accuracy: {r.text()}" for r in diff.accuracy_regressions]
    failing = {t.cell: t for t in diff.newly_failing}
    for change in diff.kernel_call_changes:
        # what a call ran is news; beside a newly failing test of its cell it is the first lead
        if change.cell in failing:
            found.append(f"kernel changed: {change.text()}, with {failing[change.cell].test} newly failing")
    return found


def diff_reports(
    old: Report,
    new: Report,
    *,
    slowdown_threshold: float = DEFAULT_THRESHOLD,
    route_changes_regress: bool = False,
    skip_not_run: bool = False,
    pairs: Sequence[tuple[str, str]] = (),
    accuracy_factor: float = DEFAULT_FACTOR,
    gate_flaky: bool = False,
    history: list[Report] | None = None,
) -> ReportDiff:
    """What changed from old to new. A backend moving to another backend is a regression; a change of
    route within one backend (e.g. ascendc:stable-api → ascendc:composite-fwd) only when
    route_changes_regress. With skip_not_run, cells the new report did not run (e.g. self-hosted cells
    skipped for a fork's pull request) are listed as not compared instead of regressing. With pairs,
    only those (old cell, new cell) pairs are compared, each under the name "old → new". An accuracy
    error regresses when it grows past accuracy_factor times its old value and its dtype's floor. A
    newly failing test labelled flaky or seed-dependent regresses only with gate_flaky. With `history`
    (the reports kept before the new one, oldest first) speed is judged by the trailing median where it
    has enough reports of a row (gdn.matrix.speed_gate)."""
    diff = ReportDiff(
        threshold=slowdown_threshold, accuracy_factor=accuracy_factor, gate_flaky=gate_flaky, history=history
    )
    before, after = _paired(old, new, pairs) if pairs else (_cells(old), _cells(new))
    diff.cells_added = [name for name in after if name not in before]
    diff.cells_removed = [name for name in before if name not in after]
    for name, cell in after.items():
        if skip_not_run and cell.status == "not_run":
            diff.not_compared.append(name)
            continue
        if name in before:
            _compare_cell(diff, name, before[name], cell)
        diff.expectation_violations += _violations(cell)
    diff.regressions = _regressions(diff, route_changes_regress)
    return diff


# ---------------------------------------------------------------- markdown


def _section(title: str, lines: list[str]) -> list[str]:
    return [f"### {title}", "", *lines] if lines else []


def _bullets(items: list[str]) -> list[str]:
    return [f"- {md_cell(item)}" for item in items] + [""] if items else []


def render_markdown(diff: ReportDiff) -> str:
    lines = ["## gdn-matrix diff", ""]
    if diff.regressions:
        lines += [f"**{len(diff.regressions)} regression(s)**", "", *_bullets(diff.regressions)]
    else:
        lines += ["No regressions.", ""]
    backend_rows = [
        [c.cell, c.op, c.device, c.old_text, c.new_text, "backend" if c.backend_changed else "route", c.why]
        for c in diff.backend_changes
    ]
    lines += _section(
        "Backend resolution",
        md_table(["cell", "op", "device", "old", "new", "change", "why"], backend_rows) if backend_rows else [],
    )
    kernel_rows = [
        [
            k.cell,
            k.peer,
            k.old,
            k.new,
            "; ".join(k.speed) or "not timed in both",
            "; ".join(k.with_) or "no slowdown, no resolution loss",
        ]
        for k in diff.kernel_changes
    ]
    lines += _section(
        "Peer kernels (what the peer itself runs)",
        md_table(["cell", "peer", "old", "new", "its speed", "came with"], kernel_rows) if kernel_rows else [],
    )
    call_rows = [
        [c.cell, c.step, c.level, c.function, c.dtype, ", ".join(c.old) or "—", ", ".join(c.new) or "—"]
        for c in diff.kernel_call_changes
    ]
    lines += _section(
        "Kernels the calls ran (kernels.json)",
        md_table(["cell", "step", "level", "function", "dtype", "old", "new"], call_rows) if call_rows else [],
    )
    lines += _section("Comparisons that compare less", _bullets([loss.text() for loss in diff.comparison_losses]))
    lines += _section(
        f"Accuracy: errors grown past {diff.accuracy_factor:g}x (and their dtype's floor)",
        accuracy_report.regression_markdown(diff.accuracy_regressions),
    )
    lines += _section("Newly failing tests", _bullets([_failing_line(t) for t in diff.newly_failing if diff.gated(t)]))
    lines += _section(
        "Newly failing, flaky or seed-dependent (not gated; --gate-flaky gates them)",
        _bullets([_failing_line(t) for t in diff.ungated_failing]),
    )
    lines += _section("No longer failing", _bullets([f"{t.cell}: `{t.test}`" for t in diff.newly_passing]))
    lines += _section(
        "Cell status",
        _bullets(
            [
                f"{c.cell}: {c.old} → {c.new}{' (regression)' if c.gates(diff.gate_flaky) else ''}"
                + (" (on flaky or seed-dependent failures alone)" if c.regressed and c.on_ungated_failures else "")
                for c in diff.status_changes
            ]
        ),
    )
    version_rows = [[v.cell, v.package, v.old, v.new] for v in diff.version_changes]
    lines += _section("Versions", md_table(["cell", "package", "old", "new"], version_rows) if version_rows else [])
    lines += _section("Locks", _bullets([change.text for change in diff.lock_changes]))
    lines += _section("Cells added", _bullets(diff.cells_added))
    lines += _section("Not compared (not run in the new report)", _bullets(diff.not_compared))
    lines += _section("Cells removed", _bullets(diff.cells_removed))
    lines += _section(
        "Expectations not met", _bullets([f"{name}: {expectation_text(e)}" for name, e in diff.expectation_violations])
    )
    slow_rows = [
        [s.cell, s.label, f"{s.old_ms:.4g}", f"{s.new_ms:.4g}", f"+{s.ratio:.0%}", f"+{s.allowed:.0%}", s.rule]
        for s in diff.slowdowns
    ]
    header = ["cell", "benchmark", "baseline ms", "new ms", "change", "allowed", "judged against"]
    lines += _section(
        f"Slower than allowed (by more than {diff.threshold:.0%}, or the history's spread)",
        md_table(header, slow_rows) if slow_rows else [],
    )
    lines += _section("Speed rules", _bullets(_speed_rule_lines(diff)))
    lines += _section(
        "Fastest backend",
        _bullets([f"{f.cell}: fastest at {f.group}: {f.old} -> {f.new}" for f in diff.fastest_changes]),
    )
    return "\n".join(lines).rstrip() + "\n"


def _failing_line(t: TestChange) -> str:
    return f"{t.cell}: `{t.test}` ({t.outcome}{t.label_text}) {(t.message or '')[:200]}"


def _speed_rule_lines(diff: ReportDiff) -> list[str]:
    """Which rule judged how many benchmark rows, and the history entries that could not be read."""
    if not diff.speed_rules and diff.history is None:
        return []
    lines = [f"{count} row(s) judged against the {rule}" for rule, count in sorted(diff.speed_rules.items())]
    if diff.history is not None:
        lines.append(
            f"history: {len(diff.history)} report(s) before the new one; a row needs {speed_gate.MIN_REPORTS}"
            f" for its trailing median (over the last {speed_gate.WINDOW})"
        )
    return lines + [f"history entry not read: {problem}" for problem in diff.history_problems]


# ---------------------------------------------------------------- gdn-matrix diff


def _timing_problem(report: Report, path: Path) -> str | None:
    """Where a benchmark row's `ms` is neither null (not timed) nor a finite number above 0: such a row
    was left out of the comparison, so a slowdown to NaN, 0 or "fast" passed. The older untyped rows
    (`impl`, no `backend`) may say "n/a"."""
    for i, cell in enumerate(report.cells):
        for j, row in enumerate(cell.bench or []):
            ms = row.get("ms") if isinstance(row, dict) else None
            if ms is None or ("backend" not in row and isinstance(ms, str)):
                continue
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
                where = location(("cells", i, "bench", j, "ms"))
                return f"{path}: {where}: {ms!r} is not a time (a finite number of ms > 0, or null)"
    return None


def load_report(path: Path) -> Report:
    """The report, validated against its model (gdn.matrix.schema.Report) and with its defaults filled;
    read within REPORT_FILE_MAX_BYTES, as strict JSON, its timings checked."""
    try:
        text = read_capped(path, REPORT_FILE_MAX_BYTES, follow_symlinks=True)
    except (OSError, UnreadableFileError) as exc:
        raise ReportError(f"cannot read report {path}: {exc}") from None
    try:
        header = parse_json(text, str(path))
    except UnreadableFileError as exc:
        raise ReportError(str(exc)) from None
    if isinstance(header, dict) and header.get("schema") != schema.REPORT_SCHEMA:
        raise ReportError(
            f"{path} has report schema {header.get('schema')!r}; this gdn-matrix reads schema {schema.REPORT_SCHEMA}"
        )
    try:
        report = schema.load(schema.Report, text, str(path))
    except schema.SchemaError as exc:
        raise ReportError(f"{exc}") from None
    names = [cell.name for cell in report.cells]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ReportError(f"{path} names these cells more than once: {', '.join(duplicates)}")
    problem = _timing_problem(report, path)
    if problem:
        raise ReportError(problem)
    return report


def _finite_at_least(minimum: float) -> Callable[[str], float]:
    """An argparse type for a finite number of at least `minimum`: nan compares false with every bound,
    so it would pass any check made with it."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {minimum:g}, got {text!r}")
        return value

    return parse


# a slowdown is a fraction, so any threshold >= 0 means something
_threshold = _finite_at_least(0)
# an accuracy factor below 1 would make every unchanged error a regression
_factor = _finite_at_least(1)


def _pair(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise argparse.ArgumentTypeError(f"expected OLD_CELL=NEW_CELL, got {text!r}")
    return old, new


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=Path, metavar="OLD", help="the report.json before the change")
    parser.add_argument("new", type=Path, metavar="NEW", help="the report.json after the change")
    parser.add_argument(
        "--threshold",
        type=_threshold,
        default=DEFAULT_THRESHOLD,
        help="relative slowdown of a benchmark row that counts as a regression (default: 0.1 = 10%%)",
    )
    parser.add_argument(
        "--route-changes-regress",
        action="store_true",
        help="also count a change of route within the same backend as a regression",
    )
    parser.add_argument(
        "--skip-not-run",
        action="store_true",
        help="do not compare cells the new report did not run (e.g. self-hosted cells skipped for a fork)",
    )
    parser.add_argument(
        "--pair",
        type=_pair,
        action="append",
        default=[],
        metavar="OLD_CELL=NEW_CELL",
        help="compare cell OLD_CELL of OLD with cell NEW_CELL of NEW (repeatable); only the pairs are compared",
    )
    parser.add_argument(
        "--accuracy-factor",
        type=_factor,
        default=DEFAULT_FACTOR,
        metavar="X",
        help=f"an accuracy error that grows past X times its old value (and its dtype's floor) is a regression "
        f"(default: {DEFAULT_FACTOR:g})",
    )
    parser.add_argument(
        "--gate-flaky",
        action="store_true",
        help="also count newly failing tests labelled flaky or seed-dependent (and a cell status that moved on "
        "them alone) as regressions",
    )
    parser.add_argument(
        "--history",
        type=Path,
        metavar="DIR",
        help="judge each benchmark row against its trailing median in this history (`gdn-matrix history add`) "
        f"where it has {speed_gate.MIN_REPORTS} reports of the row, else against OLD",
    )
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when there are regressions")
    parser.add_argument(
        "--output",
        type=Path,
        metavar="FILE",
        help="also write the Markdown to FILE, cut to fit a GitHub job summary (standard output has it whole)",
    )


def _history(directory: Path | None, new: Report) -> tuple[list[Report] | None, list[str]]:
    """The history's reports before `new`, or None without --history; ReportError for a --history that
    is not a history directory."""
    if directory is None:
        return None, []
    if not directory.is_dir():
        raise ReportError(f"--history {directory}: no such directory")
    try:
        return speed_gate.trailing_reports(directory, new.generated_at)
    except HistoryError as exc:
        raise ReportError(f"--history {directory}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    try:
        old, new = load_report(args.old), load_report(args.new)
        history, history_problems = _history(args.history, new)
    except ReportError as exc:
        print(f"gdn-matrix diff: error: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        diff = diff_reports(
            old,
            new,
            slowdown_threshold=args.threshold,
            route_changes_regress=args.route_changes_regress,
            skip_not_run=args.skip_not_run,
            pairs=args.pair,
            accuracy_factor=args.accuracy_factor,
            gate_flaky=args.gate_flaky,
            history=history,
        )
        diff.history_problems = history_problems
    except ReportError as exc:
        print(f"gdn-matrix diff: error: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except Exception:
        # exit 1 means a regression and nothing else: a crash is not a verdict on the upgrade
        traceback.print_exc()
        print("gdn-matrix diff: error: the comparison itself failed (see above)", file=sys.stderr)
        return EXIT_UNUSABLE
    markdown = diff.to_markdown()
    if args.output is not None:
        try:
            atomic_write(args.output, fit_summary(markdown, "diff is in gdn-matrix diff's standard output"))
        except OSError as exc:
            print(f"gdn-matrix diff: error: cannot write --output {args.output}: {exc}", file=sys.stderr)
            return EXIT_UNUSABLE
    print(markdown, end="")
    return EXIT_REGRESSION if diff.regressions and not args.no_fail else EXIT_OK


PROGRAM = Program(
    "gdn-matrix diff",
    "Compare two gdn-matrix report.json files.",
    add_arguments,
    run,
    EXIT_CODES,
    argparse.RawDescriptionHelpFormatter,
)
main = PROGRAM.main


if __name__ == "__main__":
    sys.exit(main())
