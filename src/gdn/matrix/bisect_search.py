"""The search of `gdn-matrix bisect`, over package sets alone: which change between a good lock and a
bad one flips a cell's tests. It knows nothing of uv or pytest; it asks a trial function for the verdict
of a set of packages (the good lock's, with some of the bad lock's changes applied), so that the
search is tested with a pure function standing in for the environments.

The changes are ordered (by name) and grouped in units, one change each to begin with. The search is a
binary search over prefixes of the units: the empty prefix is the good lock, the whole list the bad
one; it keeps the longest prefix known to pass and the shortest known to fail, and tries the middle.
When the environment of a prefix is broken (its packages do not hold together: a change needs another
that the prefix leaves at the good lock's version, or that the bad lock removes), the units the trial's
conflicts name are joined into one unit and the search starts over with the steps it already ran
remembered; when the conflicts name no change, the two units on either side of the split are joined,
so the split moves. Every join shrinks the list, so the search ends, with one unit between the last
passing and the first failing prefix: one package, or the smallest group found that installs together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gdn.matrix.schema import BisectResult, BisectStep, PackageChange, StepOutcome


@dataclass(frozen=True)
class Trial:
    """An environment's verdict. `conflicts` are (requirer, required) package names of the requirements
    that do not hold in it (a broken one); `detail` says why, for the step's line."""

    outcome: StepOutcome
    detail: str = ""
    conflicts: tuple[tuple[str, str], ...] = ()


# the packages of an environment (canonical name -> version) -> its verdict
TrialFunction = Callable[[Mapping[str, str]], Trial]


def differences(good: Mapping[str, str], bad: Mapping[str, str]) -> list[PackageChange]:
    """Every package the two locks do not share at one version, by name."""
    names = sorted(set(good) | set(bad))
    return [PackageChange(n, good.get(n), bad.get(n)) for n in names if good.get(n) != bad.get(n)]


def compose(good: Mapping[str, str], changes: Sequence[PackageChange]) -> dict[str, str]:
    """The good lock's packages with `changes` taken from the bad lock."""
    packages = dict(good)
    for change in changes:
        if change.bad is None:
            packages.pop(change.name, None)
        else:
            packages[change.name] = change.bad
    return dict(sorted(packages.items()))


@dataclass
class Search:
    """One bisection; `echo` gets each step's line as it finishes."""

    good: Mapping[str, str]
    bad: Mapping[str, str]
    trial: TrialFunction
    echo: Callable[[str], None] = print
    steps: list[BisectStep] = field(default_factory=list)
    _total: int = 0
    _seen: dict[frozenset[str], Trial] = field(default_factory=dict)

    def run(self, cell: str, good_lock: str, bad_lock: str, tests: Sequence[str]) -> BisectResult:
        started = time.monotonic()
        changes = differences(self.good, self.bad)
        self._total = len(changes)
        result = BisectResult(cell, good_lock, bad_lock, list(tests), changes, "unusable", self.steps)
        if not changes:
            result.verdict = "no_failure"
            self.echo("the two locks list the same packages: nothing to bisect")
        else:
            result.verdict, result.culprit = self._bisect(changes)
        result.duration_s = round(time.monotonic() - started, 2)
        return result

    def _bisect(self, changes: list[PackageChange]) -> tuple[str, list[PackageChange]]:
        bad = self._try(changes)
        if bad.outcome != "fail":
            return ("no_failure" if bad.outcome == "pass" else "unusable"), []
        good = self._try([])
        if good.outcome != "pass":
            return ("good_fails" if good.outcome == "fail" else "unusable"), []
        units = [[change] for change in changes]
        while True:
            passing, failing = 0, len(units)  # the prefix lengths known to pass and to fail
            while failing - passing > 1:
                middle = (passing + failing) // 2
                trial = self._try([c for unit in units[:middle] for c in unit])
                if trial.outcome == "pass":
                    passing = middle
                elif trial.outcome == "fail":
                    failing = middle
                else:
                    units = join(units, trial.conflicts, middle)
                    break
            else:
                return "found", units[passing]

    def _try(self, applied: list[PackageChange]) -> Trial:
        key = frozenset(c.name for c in applied)
        if key in self._seen:
            return self._seen[key]
        started = time.monotonic()
        trial = self.trial(compose(self.good, applied))
        step = BisectStep(
            number=len(self.steps) + 1,
            from_bad=sorted(key),
            outcome=trial.outcome,
            duration_s=round(time.monotonic() - started, 2),
            detail=trial.detail,
            conflicts=[f"{requirer} needs {required}" for requirer, required in trial.conflicts],
        )
        self.steps.append(step)
        self._seen[key] = trial
        self.echo(step_line(step, self._total, applied))
        return trial


def join(
    units: list[list[PackageChange]], conflicts: Sequence[tuple[str, str]], split: int
) -> list[list[PackageChange]]:
    """`units` with those that must change together joined, at the place of the first: the units of each
    conflict's two packages where both are changes, else the two units on either side of `split`."""
    where = {change.name: index for index, unit in enumerate(units) for change in unit}
    pairs = [(where[a], where[b]) for a, b in conflicts if a in where and b in where and where[a] != where[b]]
    if not pairs:
        pairs = [(split - 1, split)]
    # union of the units that the pairs connect
    owner = list(range(len(units)))

    def root(index: int) -> int:
        while owner[index] != index:
            index = owner[index]
        return index

    for a, b in pairs:
        first, second = sorted((root(a), root(b)))
        owner[second] = first
    joined: dict[int, list[PackageChange]] = {}
    for index, unit in enumerate(units):
        joined.setdefault(root(index), []).extend(unit)
    return [joined[index] for index in sorted(joined)]


def step_line(step: BisectStep, changes: int, applied: Sequence[PackageChange]) -> str:
    """A step as the command prints it: which packages come from which lock, the outcome, the time."""
    if not applied:
        taken = "the good lock alone"
    elif len(applied) == changes:
        taken = "the bad lock whole"
    else:
        taken = f"{len(applied)} of {changes} changes from the bad lock: " + ", ".join(c.describe() for c in applied)
    line = f"step {step.number}: {taken} -> {step.outcome} ({step.duration_s:.1f} s)"
    return line + (f": {step.detail}" if step.detail else "")
