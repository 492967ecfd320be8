"""A pytest plugin that writes each test's outcome as the test finishes, one JSON line per test.

pytest writes junit.xml only when the whole session ends: a cell stopped by a signal or its timeout
would otherwise keep no trace of the tests that ran before it, the failures included. The cell entry
loads this plugin (`-p gdn.matrix.outcomes --gdn-outcomes results/<cell>/tests.jsonl`); the runner
reads the file back when the run ends early. Under pytest-xdist only the controlling process writes
(the workers' reports reach it).

A line: {"nodeid", "outcome" (passed, failed, error, skipped), "family", "message", "duration_s",
"kernels", "comparison", "seed"}: a failed or errored test carries the calls it made and what they ran
(where gdn.matrix.kernels_plugin records them), a test that compares a backend with another carries
what it compared (the `gdn_comparison` property: the mode, the ops it served, the ops that fell back and
why), and a test that drew random inputs the seed it drew them with (`draw_seed`; the `seed` property,
in junit.xml too), so that its failure can be replayed and rerun (gdn.matrix.reruns).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gdn.matrix.jsonio import RESULTS_FILE_MAX_BYTES, parse_json, read_capped

if TYPE_CHECKING:  # the runner and the report read the file back without pytest
    import pytest

OPTION = "--gdn-outcomes"
FILE = "tests.jsonl"
MESSAGE_CHARS = 300
OUTCOMES = ("passed", "failed", "error", "skipped")
# the user property by which a test says what a backend comparison compared (JSON: {"mode": ...,
# "compared": {op: route}, "fell_back": {op: why}, "not_compared": {case: why}}), and the report
# attribute of the kernels plugin
COMPARISON = "gdn_comparison"
KERNELS = "gdn_kernels"
# the user property holding the seed a test drew (an int), and the variable that sets it for a replay
SEED = "seed"
SEED_ENV = "GDN_TEST_SEED"


@dataclass(frozen=True)
class FinishedTest:
    nodeid: str
    outcome: str
    family: str | None = None
    message: str | None = None
    duration_s: float = 0.0
    kernels: list[dict[str, Any]] | None = None
    comparison: dict[str, Any] | None = None
    seed: int | None = None


def draw_seed(node: pytest.Item) -> int:
    """The seed of the test's random inputs: $GDN_TEST_SEED where set (a replay, or a rerun with the
    failure's own seed), else a fresh one. It is printed, and recorded as the test's `seed` property
    (junit.xml, tests.jsonl), so that a failure names the seed that replays it."""
    seed = int(os.environ.get(SEED_ENV) or int.from_bytes(os.urandom(4), "little"))
    print(f"random seed: {SEED_ENV}={seed}")
    node.user_properties.append((SEED, seed))
    return seed


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, metavar="PATH", help="append each test's outcome to PATH as it finishes (JSON lines)")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption(OPTION)
    if path and not hasattr(config, "workerinput"):  # an xdist worker: its controller writes
        config.pluginmanager.register(OutcomeWriter(Path(path)), "gdn-outcomes-writer")


def finished(report: pytest.TestReport) -> FinishedTest | None:
    """The test's outcome where this report settles it: its call, or a setup / teardown that did not
    pass (an error, or a skip at setup)."""
    if report.when == "call":
        outcome = "skipped" if report.skipped else report.outcome
    elif report.failed:
        outcome = "error"
    elif report.skipped:
        outcome = "skipped"
    else:
        return None
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if message is None and isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        message = str(report.longrepr[-1])
    properties = dict(report.user_properties)
    comparison = properties.get(COMPARISON)
    seed = properties.get(SEED)
    return FinishedTest(
        nodeid=report.nodeid,
        outcome=outcome,
        family=properties.get("family"),
        message=message[:MESSAGE_CHARS] if message else None,
        duration_s=round(report.duration, 3),
        kernels=getattr(report, KERNELS, None) if outcome in ("failed", "error") else None,
        comparison=json.loads(comparison) if isinstance(comparison, str) else None,
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
    )


class OutcomeWriter:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = path.open("a")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = finished(report)
        if test is not None:
            self.handle.write(json.dumps(asdict(test)) + "\n")
            self.handle.flush()

    def pytest_unconfigure(self) -> None:
        self.handle.close()


def read_finished(path: Path) -> list[FinishedTest]:
    """The tests a run finished, in the order they finished; a line that is not a finished test (the
    last one, cut short by the end of the run) is left out. Read within the results files' cap, and
    only as a regular file (OSError, or UnreadableFileError, where it is not one)."""
    try:
        data = read_capped(path, RESULTS_FILE_MAX_BYTES)
    except FileNotFoundError:
        return []
    tests = []
    known = {f.name for f in fields(FinishedTest)}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            found = parse_json(line, path.name)
            # keys a newer writer adds are left out, as every results file's reader leaves them
            test = FinishedTest(**{k: v for k, v in found.items() if k in known})
        except (ValueError, TypeError, AttributeError):
            continue
        if test.outcome in OUTCOMES:
            tests.append(test)
    return tests
