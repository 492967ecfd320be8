"""A pytest plugin that records what each test's op calls really ran (gdn.matrix.kernels):

    pytest -p gdn.matrix.kernels_plugin --gdn-kernels results/<cell>/kernels.json

Each test's report carries the calls its phases made (`gdn_kernels`: a setup that passed hands its calls
to the call phase), which pytest-xdist sends from its workers with the report; gdn.matrix.outcomes
writes them beside a failing test in tests.jsonl; the process that receives the reports sums them into
the kernels file's "tests" step when the session ends.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Generator
from pathlib import Path

import pytest

from gdn.kernel_log import KernelEntry, KernelLog
from gdn.matrix.kernels import OPTION, add_step, entries, kernel_records, recording
from gdn.matrix.outcomes import KERNELS

STEP = "tests"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, metavar="PATH", help="record what each test's op calls ran; write the sums to PATH")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption(OPTION)
    if path:
        # an xdist worker records and reports; the process that receives the reports writes the file
        writes = not hasattr(config, "workerinput")
        config.pluginmanager.register(TestKernels(Path(path), writes), "gdn-kernels")


class TestKernels:
    """Records each test's calls into its reports; where `writes`, sums the reports into the file."""

    __test__ = False  # a plugin, not a test class

    def __init__(self, path: Path, writes: bool) -> None:
        self.path = path
        self.writes = writes
        self.log = KernelLog()
        self.mark: Counter[KernelEntry] = Counter()
        self.totals: Counter[KernelEntry] = Counter()
        self._recording = contextlib.ExitStack()

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._recording.enter_context(recording(self.log))

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.mark = self.log.mark()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Generator[None, object, object]:
        report = yield
        if isinstance(report, pytest.TestReport) and not (report.when == "setup" and report.passed):
            setattr(report, KERNELS, kernel_records(self.log.since(self.mark)))
            self.mark = self.log.mark()
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.writes:
            self.totals.update(entries(getattr(report, KERNELS, None) or []))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._recording.close()
        if self.writes:
            add_step(self.path, STEP, self.totals)
