"""Flaky or real: rerun a cell's failing tests inside the cell's own run and label each failure.

The cell entry calls `rerun_cell_failures` once pytest has failed (gdn.matrix.entry), so the reruns run in
the cell's runtime (its container, or the host for a host-runtime run) and within its timeout. Each
failing test of tests.jsonl is rerun alone, in a pytest of its own: first with the seed it failed with
(GDN_TEST_SEED, gdn.matrix.outcomes.draw_seed), then with fresh seeds. Its label:

    flaky           a rerun with its own seed passed: the same inputs gave two outcomes
    seed_dependent  every rerun with its own seed failed and a fresh seed passed: a tolerance tail
    deterministic   every rerun failed, its own seed and the fresh ones
    not_rerun       the reruns did not settle it: past the first MAX_TESTS failures, the budget spent,
                    or the cell ended while they ran (the reason says which); never counted as settled

A test that draws no seed is rerun as it is; with nothing to vary, its reruns with its own seed are
all it gets. Only a rerun that passed counts as passing (a skip or a rerun that recorded nothing does
not). reruns.json (schema.RerunsFile) is written before the first rerun and after each one, so that a
cell killed meanwhile leaves every failure labelled with what its reruns had shown so far.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gdn.matrix import outcomes
from gdn.matrix.outcomes import FinishedTest, read_finished
from gdn.matrix.schema import FailureRerun, RerunAttempt, RerunsFile

FILE = "reruns.json"
# The bounds. One rerun is a pytest of its own (its start, torch's import, a kernel's first compile:
# 5-20 s in a cell) plus the test. Two reruns with the failure's own seed tell a flaky test from a
# stable one; three fresh seeds find a passing seed for a tolerance tail that fails with a few percent of
# seeds at most (the cases that made CI fail: a relative error of 1.2e-5 against 1e-5, 0.0141 against
# 0.012) while a test that fails for every seed gets few enough reruns. Ten failures is past a
# tolerance tail: a cell failing that much is broken, and the rest are labelled not_rerun. The budget,
# 10 minutes, stays well inside a cell's default timeout (an hour) beside its tests.
MAX_TESTS = 10
SAME_SEED_RERUNS = 2
FRESH_SEED_RERUNS = 3
BUDGET_S = 600.0
# the cell entry's exit status when tests failed and every failure is flaky (gdn.matrix.results.status_of)
FLAKY_EXIT = 3


@dataclass(frozen=True)
class RerunLimits:
    max_tests: int = MAX_TESTS
    same_seed: int = SAME_SEED_RERUNS
    fresh_seed: int = FRESH_SEED_RERUNS
    budget_s: float = BUDGET_S


def _node_argument(rootdir: Path, nodeid: str) -> str:
    """The node id as a pytest argument from any working directory: its file made absolute."""
    path, sep, rest = nodeid.partition("::")
    return str(rootdir / path) + sep + rest


def _rerun_once(
    test: FinishedTest, seed: int | None, rootdir: Path, env: dict[str, str], cwd: Path, timeout_s: float
) -> RerunAttempt | None:
    """One rerun of `test`, with `seed` (None: the test draws a fresh one); None when it ran past
    timeout_s (what is left of the budget): cut short, it showed nothing."""
    run_env = {k: v for k, v in env.items() if k != outcomes.SEED_ENV}
    if seed is not None:
        run_env[outcomes.SEED_ENV] = str(seed)
    with tempfile.TemporaryDirectory(prefix="gdn-rerun-") as scratch:
        written = Path(scratch) / outcomes.FILE
        command = [sys.executable, "-m", "pytest", _node_argument(rootdir, test.nodeid), f"--rootdir={rootdir}"]
        command += ["-p", "no:cacheprovider", "-q", "-p", "no:xdist", "-p", "gdn.matrix.outcomes"]
        command += [f"{outcomes.OPTION}={written}"]
        started = time.monotonic()
        try:
            code = subprocess.run(
                command, cwd=cwd, env=run_env, stdin=subprocess.DEVNULL, timeout=max(timeout_s, 1.0), check=False
            ).returncode
        except subprocess.TimeoutExpired:
            return None
        elapsed = round(time.monotonic() - started, 2)
        found = [t for t in read_finished(written) if t.nodeid == test.nodeid]
    fresh = seed is None
    if not found:
        message = f"the rerun recorded no outcome for the test (pytest exit status {code})"
        return RerunAttempt(seed, fresh, "error", elapsed, message)
    # a test's setup, call and teardown each may report; the worst of them is its outcome
    worst = next((t for t in found if t.outcome in ("failed", "error")), found[-1])
    return RerunAttempt(worst.seed if worst.seed is not None else seed, fresh, worst.outcome, elapsed, worst.message)


def label_of(failure: FailureRerun, limits: RerunLimits) -> tuple[str, str | None]:
    """The label its attempts so far give, and why; not_rerun until they settle it."""
    own = [a for a in failure.attempts if not a.fresh_seed]
    fresh = [a for a in failure.attempts if a.fresh_seed]
    if any(a.outcome == "passed" for a in own):
        return "flaky", f"passed on rerun {[a.outcome for a in own].index('passed') + 1} with its own seed"
    if any(a.outcome == "passed" for a in fresh):
        passed = next(a for a in fresh if a.outcome == "passed")
        return "seed_dependent", f"failed {len(own)} reruns with its own seed, passed with seed {passed.seed}"
    wanted_fresh = limits.fresh_seed if failure.seed is not None else 0
    if len(own) >= limits.same_seed and len(fresh) >= wanted_fresh:
        return "deterministic", f"failed all {len(own) + len(fresh)} reruns"
    return "not_rerun", None


def _settled(failure: FailureRerun, limits: RerunLimits) -> bool:
    return label_of(failure, limits)[0] != "not_rerun"


def rerun_failures(
    finished: list[FinishedTest],
    out: Path,
    *,
    rootdir: Path,
    env: dict[str, str],
    cwd: Path,
    limits: RerunLimits = RerunLimits(),
) -> RerunsFile:
    """Rerun the failed and errored tests of `finished` (a run's tests.jsonl) and write out/reruns.json
    after each rerun; `rootdir` is the pytest root their node ids are relative to."""
    started = time.monotonic()
    # a test that failed its call and errored in its teardown has two lines: one failure
    failed = list({t.nodeid: t for t in reversed(finished) if t.outcome in ("failed", "error")}.values())[::-1]
    record = RerunsFile(
        failures=[
            FailureRerun(t.nodeid, t.outcome, "not_rerun", seed=t.seed, reason="the cell ended before its reruns")
            for t in failed
        ],
        max_tests=limits.max_tests,
        same_seed_reruns=limits.same_seed,
        fresh_seed_reruns=limits.fresh_seed,
        budget_s=limits.budget_s,
    )
    for failure in record.failures[limits.max_tests :]:
        failure.reason = f"past the first {limits.max_tests} failing tests, which alone are rerun"
    record.write(out)
    for test, failure in zip(failed[: limits.max_tests], record.failures, strict=False):
        # a test that draws no seed has none to vary: its reruns are those with its own (no) seed
        plan = [test.seed] * limits.same_seed + ([None] * limits.fresh_seed if test.seed is not None else [])
        for seed in plan:
            left = limits.budget_s - (time.monotonic() - started)
            if _settled(failure, limits) or left <= 0:
                break
            attempt = _rerun_once(test, seed, rootdir, env, cwd, left)
            if attempt is None:
                break
            # an unseeded test's reruns are reruns with its own seed, whatever `seed` None means here
            attempt.fresh_seed = attempt.fresh_seed and test.seed is not None
            failure.attempts.append(attempt)
            failure.label, failure.reason = label_of(failure, limits)
            if failure.label == "not_rerun":
                failure.reason = "the cell ended before its reruns settled it"
            record.elapsed_s = round(time.monotonic() - started, 2)
            record.write(out)
        if not _settled(failure, limits):
            done = len(failure.attempts)
            failure.reason = f"the rerun budget ({limits.budget_s:g} s) was spent after {done} of {len(plan)} reruns"
    record.elapsed_s = round(time.monotonic() - started, 2)
    record.finished = True
    record.write(out)
    return record


def only_flaky(record: RerunsFile) -> bool:
    """Whether every failure of the run passed on a rerun with its own seed."""
    return bool(record.failures) and all(f.label == "flaky" for f in record.failures)


def rerun_cell_failures(
    out: Path, tests: Path, env: dict[str, str], cwd: Path, limits: RerunLimits = RerunLimits()
) -> RerunsFile:
    """The cell entry's step: rerun the failures its pytest recorded in out/tests.jsonl (pytest run with
    `tests` and its parent as the root, as the entry runs it)."""
    finished = read_finished(out / outcomes.FILE)
    return rerun_failures(finished, out, rootdir=tests.parent, env=env, cwd=cwd, limits=limits)
