"""The answer of `gdn-matrix check` (gdn.matrix.check): its typed model, which `--json` prints, and its
text. Each cell's answer names the report it comes from and that report's date."""

from __future__ import annotations

from dataclasses import dataclass, field

from gdn.matrix.schema import Failure, FamilyCounts
from gdn.matrix.versions import NOT_INSTALLED

# the exit status of a stack its cell covers, passed, with no regression
EXIT_SAFE = 0
THIS_ENVIRONMENT = "this environment"


# ---------------------------------------------------------------- the answer's model


@dataclass
class Difference:
    """A version (or the device kind, under the key "device") where a stack and a cell differ."""

    key: str
    stack: str | None
    cell: str | None


@dataclass
class OpResolution:
    """What served an op on the cell's device there, and what served it in the stack compared with
    (this environment, or for a target the cell of this environment's stack)."""

    op: str
    device: str
    cell: str
    compared: str
    same: bool


@dataclass
class LastGood:
    """The newest report of the history where the cell passed."""

    generated_at: str
    entry: str
    versions: dict[str, str]
    lock: str | None


@dataclass
class CellAnswer:
    """What a report says of one cell: its status, tests, resolution, peers' kernels, speed and
    accuracy rows, and where that comes from."""

    cell: str
    report: str
    generated_at: str
    device: str | None
    status: str
    reason: str | None
    versions: dict[str, str | None]
    families: dict[str, FamilyCounts]
    failures: list[Failure]
    resolution: list[OpResolution]
    peer_kernels: list[str]
    speed: list[str]
    accuracy: list[str]
    last_good: LastGood | None = None


@dataclass
class Nearest:
    cell: str
    report: str
    generated_at: str
    differences: list[Difference]


@dataclass
class StackAnswer:
    """One stack (this environment's, or the one `--to` makes) and the cells of one report that cover
    it, or the nearest cell when none does; `pinned_by` names matrix.yaml's cells that pin it (--matrix)."""

    stack: dict[str, str | None]
    device: str
    covered: list[CellAnswer] = field(default_factory=list)
    nearest: Nearest | None = None
    pinned_by: list[str] = field(default_factory=list)


@dataclass
class CheckAnswer:
    here: StackAnswer
    target: StackAnswer | None = None
    # the target cell against this stack's cell, as `gdn-matrix diff --pair` words them
    regressions: list[str] = field(default_factory=list)
    verdict: str = ""
    exit_code: int = EXIT_SAFE


# ---------------------------------------------------------------- text


def _stack_text(stack: dict[str, str | None], device: str) -> str:
    return ", ".join([f"device {device}", *(f"{k} {v}" for k, v in stack.items() if v is not None)])


def _cell_lines(answer: CellAnswer, compared: str) -> list[str]:
    where = f"cell {answer.cell} of {answer.report} ({answer.generated_at})"
    lines = [f"  {where}: {answer.status}" + (f" ({answer.reason})" if answer.reason else "")]
    for family, counts in answer.families.items():
        lines.append(f"    tests {family}: {counts.passed} passed, {counts.failed} failed, {counts.error} error")
    lines += [f"    failed {f.test}: {(f.message or '').splitlines()[0] if f.message else ''}" for f in answer.failures]
    for row in answer.resolution:
        state = "same" if row.same else f"changed ({compared}: {row.compared})"
        lines.append(f"    {row.op} on {row.device}: {row.cell}: {state}")
    lines += [f"    peer kernel {line}" for line in answer.peer_kernels]
    lines += [f"    speed {line}" for line in answer.speed]
    lines += [f"    accuracy {line}" for line in answer.accuracy]
    good = answer.last_good
    lines.append(
        f"    last known good: {good.entry} ({good.generated_at})"
        if good
        else "    last known good: none in the history"
    )
    return lines


def _stack_lines(title: str, stack: StackAnswer, compared: str) -> list[str]:
    lines = [f"{title}: {_stack_text(stack.stack, stack.device)}"]
    for cell in stack.covered:
        lines += _cell_lines(cell, compared)
    if not stack.covered:
        lines.append("  no cell covers this stack")
        if stack.nearest is not None:
            near = stack.nearest
            what = "; ".join(
                f"{d.key}: {d.stack or NOT_INSTALLED} here, {d.cell or NOT_INSTALLED} in the cell"
                for d in near.differences
            )
            lines.append(f"  nearest: cell {near.cell} of {near.report} ({near.generated_at}): {what}")
    if stack.pinned_by:
        lines.append(f"  matrix.yaml cells that pin it: {', '.join(stack.pinned_by)}")
    return lines


def render_text(answer: CheckAnswer) -> str:
    lines = _stack_lines("this stack", answer.here, THIS_ENVIRONMENT)
    if answer.target is not None:
        compared = "this stack's cell" if answer.here.covered else THIS_ENVIRONMENT
        lines += ["", *_stack_lines("target", answer.target, compared)]
        lines += [f"  regression: {line}" for line in answer.regressions]
    return "\n".join([*lines, "", f"verdict: {answer.verdict}"])
