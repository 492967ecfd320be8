"""What a cell's calls really ran, as the report shows it and the diff compares it: kernels.json's steps
(gdn's choice per op call and every dispatch inside a peer, per dtype, with the candidates passed over),
the kernels beside each failing test, and what each backend comparison compared.

A comparison test records which ops the compared backend served and which fell back to another (the
`gdn_comparison` property, in tests.jsonl): its verdict holds for the served ops only, so the report and
the diff say "fla compared on 2 of 4 ops" beside it. A comparison that compares fewer ops than before is a
regression of the diff, as is a test that newly fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from gdn.matrix.markdown import md_cell, md_table
from gdn.matrix.outcomes import FinishedTest
from gdn.matrix.schema import Comparison, KernelCount, KernelsFile, ReportCell

STEPS = ("tests", "accuracy", "bench")


def kernel_line(k: KernelCount) -> str:
    """ "fla common.chunk_bwd_dqkwg float32 -> tilelang (x3; passed over: flash_qla: why)"."""
    notes = [f"x{k.calls}"]
    if k.during:
        notes.append(f"during {k.during}")
    passed = "; ".join(f"{p.backend}: {p.reason}" for p in k.passed_over)
    if passed:
        notes.append(f"passed over {passed}")
    return f"{k.level} {k.function} {k.dtype} -> {k.ran} ({', '.join(notes)})"


def cell_kernels(found: KernelsFile | None) -> dict[str, list[KernelCount]]:
    """The report's `kernels` of a cell: per step, its KernelCount records, the steps in run order."""
    if found is None:
        return {}
    return {step: found.steps[step] for step in sorted(found.steps, key=_step_order)}


def _step_order(step: str) -> tuple[int, str]:
    return (STEPS.index(step) if step in STEPS else len(STEPS), step)


def comparisons(finished: list[FinishedTest]) -> list[Comparison]:
    """The tests that compared a backend with another, with what they compared and their outcome (the
    `gdn_comparison` property as tests.jsonl wrote it)."""
    found = []
    for test in finished:
        if test.comparison is None:
            continue
        compared = test.comparison.get("compared") or {}
        fell_back = test.comparison.get("fell_back") or {}
        cases = test.comparison.get("not_compared")
        found.append(
            Comparison(
                test.nodeid,
                test.outcome,
                test.comparison.get("mode"),
                dict(compared),
                dict(fell_back),
                None if cases is None else dict(cases),
            )
        )
    return found


def comparison_text(c: Comparison) -> str:
    """ "fla compared on 2 of 4 ops; causal_conv1d_fn fell back to eager: does not implement it; not
    compared: dense/packed (why)"."""
    total = len(c.compared) + len(c.fell_back)
    text = f"{c.mode} compared on {len(c.compared)} of {total} ops"
    if c.compared:
        text += f" ({', '.join(c.compared)})"
    if c.fell_back:
        text += "; fell back: " + "; ".join(f"{op} to {why}" for op, why in c.fell_back.items())
    if c.not_compared:
        text += "; not compared: " + "; ".join(f"{case} ({why})" for case, why in c.not_compared.items())
    return text


# ---------------------------------------------------------------- report.md

# kernel lines beside one failing test in report.md (report.json has them all)
KERNEL_LINES_SHOWN = 12


def shown(records: list[KernelCount]) -> list[KernelCount]:
    """The kernel lines to show beside a failure: the test's own calls (not gdn's numeric probes), the
    peers' dispatch first, since that is what the backend's name does not say."""
    own = [k for k in records if not k.during]
    return sorted(own, key=lambda k: k.level == "gdn")[:KERNEL_LINES_SHOWN]


def peer_dispatch(cell: ReportCell) -> list[tuple[str, KernelCount]]:
    """(step, record) of every dispatch a peer made inside itself in the cell, outside gdn's probes."""
    return [(step, k) for step, records in cell.kernels.items() for k in records if k.level != "gdn" and not k.during]


def comparisons_markdown(cells: list[ReportCell]) -> list[str]:
    compared = [
        [cell.name, md_cell(c.test), c.outcome, md_cell(comparison_text(c))] for cell in cells for c in cell.comparisons
    ]
    if not compared:
        return []
    lines = ["## Comparisons", "", "A comparison's verdict holds for the ops it compared.", ""]
    return [*lines, *md_table(["cell", "test", "outcome", "what it compared"], compared), ""]


def peers_markdown(cells: list[ReportCell]) -> list[str]:
    """Every dispatch a peer made inside itself, per cell, step, function and dtype (gdn's own choice
    per op is the resolution table; per dtype and call it is in report.json)."""
    ran = [
        [cell.name, step, k.level, k.function, k.dtype, k.ran, str(k.calls)]
        for cell in cells
        for step, k in peer_dispatch(cell)
    ]
    if not ran:
        return []
    lines = ["## What the peers ran", "", "Each dispatch a peer made inside itself, per function and dtype.", ""]
    return [*lines, *md_table(["cell", "step", "peer", "function", "dtype", "ran", "calls"], ran), ""]


# ---------------------------------------------------------------- diff


@dataclass
class KernelCallChange:
    """What one (level, function, dtype) ran in a step of a cell before and after."""

    cell: str
    step: str
    level: str
    function: str
    dtype: str
    old: list[str]
    new: list[str]

    def text(self) -> str:
        old, new = ", ".join(self.old) or "not called", ", ".join(self.new) or "not called"
        return f"{self.cell} ({self.step}): {self.level} {self.function} {self.dtype}: {old} → {new}"


@dataclass
class ComparisonLoss:
    """A comparison that compares fewer ops, or fewer of its cases, than before: `lost` names them,
    `why` says why of each it can."""

    cell: str
    test: str
    lost: list[str]
    why: dict[str, str]

    def text(self) -> str:
        reasons = "; ".join(f"{op}: {self.why.get(op, 'not recorded')}" for op in self.lost)
        return f"{self.cell}: `{self.test}` no longer compares {', '.join(self.lost)} ({reasons})"


def _ran(records: list[KernelCount]) -> dict[tuple[str, str, str], list[str]]:
    """What each (level, function, dtype) ran in a step, outside gdn's numeric probes."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for k in records:
        if k.during:
            continue
        names = found.setdefault((k.level, k.function, k.dtype), [])
        if k.ran not in names:
            names.append(k.ran)
    return {key: sorted(names) for key, names in found.items()}


def kernel_call_changes(name: str, old: ReportCell, new: ReportCell) -> list[KernelCallChange]:
    """Per step both reports ran, each (level, function, dtype) whose kernels changed."""
    changes = []
    old_steps, new_steps = old.kernels, new.kernels
    for step in [s for s in new_steps if s in old_steps]:
        before, after = _ran(old_steps[step]), _ran(new_steps[step])
        for key in sorted(set(before) | set(after)):
            if before.get(key, []) != after.get(key, []):
                changes.append(KernelCallChange(name, step, *key, before.get(key, []), after.get(key, [])))
    return changes


def comparison_losses(name: str, old: ReportCell, new: ReportCell) -> list[ComparisonLoss]:
    before = {c.test: c for c in old.comparisons}
    losses = []
    for c in new.comparisons:
        previous = before.get(c.test)
        if previous is None:
            continue
        lost = sorted(set(previous.compared) - set(c.compared))
        # a case is lost only where both reports name their cases (an older report names none)
        if previous.not_compared is not None and c.not_compared is not None:
            lost += sorted(set(c.not_compared) - set(previous.not_compared))
        if lost:
            losses.append(ComparisonLoss(name, c.test, lost, c.fell_back | (c.not_compared or {})))
    return losses
