"""What a cell leaves under results/<cell>/ and how it is read back (the models: gdn.matrix.schema).

    cell.json         the outcome of the last complete run (always written, whatever happened): status,
                      reason, timings, image, exit code, log tail, whether it ran on real accelerator
                      hardware or with stand-ins, the runtime it ran in beside matrix.yaml's, and its pins
                      that the environment lacked
    interrupted.json  a run stopped by a signal, beside the last complete run (which it never replaces)
    manifest.json     `python -m gdn.matrix.probe` inside the cell (versions, devices, resolutions)
    resolution.json   the resolution records alone (gdn.resolutions())
    junit.xml         pytest --junitxml
    tests.jsonl       each test's outcome as it finished (gdn.matrix.outcomes): what a run that ended early
                      (timeout, crash) ran before it ended; read where junit.xml is missing
    reruns.json       the reruns of the failing tests and each failure's label (gdn.matrix.reruns): written
                      by the cell entry when tests failed
    bench.json        optional: {"rows": [{"op", "backend", "shape", "pass", "ms", ...}]}
    log.txt           everything the cell printed

Reading never fails as a whole: a missing, malformed or invalid file becomes a problem noted on that
cell, and every other file (and every other cell) is still read. Every file is read within a size cap
and only when it is a regular file (gdn.matrix.jsonio): a symlink to /dev/zero or a FIFO is refused
before a byte is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gdn.matrix.accuracy import FILE as ACCURACY
from gdn.matrix.jsonio import RESULTS_FILE_MAX_BYTES, UnreadableFileError, read_capped
from gdn.matrix.kernels import FILE as KERNELS
from gdn.matrix.outcomes import FILE as OUTCOMES
from gdn.matrix.outcomes import FinishedTest, read_finished
from gdn.matrix.reruns import FILE as RERUNS
from gdn.matrix.reruns import FLAKY_EXIT
from gdn.matrix.schema import (
    AccuracyFile,
    BenchFile,
    CellOutcome,
    InterruptedRun,
    KernelsFile,
    Manifest,
    RerunsFile,
    ResolutionRecord,
    SchemaError,
    TestOutcome,
    load_file,
)

FAMILY_MARKERS = ("probe", "single_op", "shape_grid", "grpo")
INTERRUPTED = "interrupted.json"
JUNIT = "junit.xml"
# How bad each status is, worse higher: evidence may make a cell worse than its cell.json says, and
# a diff counts a move up as a regression. not_run is worst: nothing about the cell is known any more.
# flaky (tests failed, each passed on a rerun with its own seed) is between passed and failed.
STATUS_RANK = {
    "passed": 0,
    "flaky": 1,
    "failed": 2,
    "error": 3,
    "timeout": 3,
    "build_failed": 4,
    "not_run": 5,
    "interrupted": 5,
}


def status_of(exit_code: int | None) -> str:
    """What the cell entry's exit status says (gdn.matrix.entry): 0 passed, 1 tests failed, 3 tests
    failed and each passed on a rerun with its own seed (gdn.matrix.reruns), else error."""
    return {0: "passed", 1: "failed", FLAKY_EXIT: "flaky"}.get(exit_code, "error")


@dataclass
class TestCase:
    name: str
    classname: str
    family: str | None
    outcome: TestOutcome
    time_s: float
    message: str | None = None


@dataclass
class CellResults:
    """Everything read back from one results/<cell>/ directory. `invalid` lists the files that did not
    validate against their model (the cell is then an error, whatever its cell.json says); `problems`
    everything that could not be read, those included, in the order found."""

    name: str
    outcome: CellOutcome | None = None
    interrupted: InterruptedRun | None = None
    # the manifest as written, once it validated: the report reads sections the model leaves open
    manifest: dict | None = None
    resolution: list[ResolutionRecord] = field(default_factory=list)
    # junit.xml's tests; where it is missing, those tests.jsonl recorded
    tests: list[TestCase] = field(default_factory=list)
    # whether a junit.xml is there (read or not), and what tests.jsonl recorded beside it
    junit_found: bool = False
    recorded: list[TestCase] = field(default_factory=list)
    bench: BenchFile | None = None
    # tests.jsonl's lines as written: a failing test's kernels, a comparison's ops
    finished: list[FinishedTest] = field(default_factory=list)
    kernels: KernelsFile | None = None
    accuracy: AccuracyFile | None = None
    reruns: RerunsFile | None = None
    invalid: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _present(path: Path) -> bool:
    """Whether anything is there, a dangling symlink included: reading it says what is wrong with it."""
    return path.is_symlink() or path.exists()


def _load(results: CellResults, directory: Path, name: str, model) -> tuple[object, object]:
    """The file validated as `model` and its JSON; (None, None) when it is absent or does not validate
    (noted on the cell)."""
    path = directory / name
    if not _present(path):
        return None, None
    try:
        return load_file(model, path)
    except SchemaError as exc:
        results.invalid.append(str(exc))
        results.problems.append(str(exc))
        return None, None


def _family(case) -> str | None:
    """The test family tests/conftest.py records on every test case as a JUnit property."""
    from junitparser import Properties

    for properties in case.iterchildren(Properties):
        for prop in properties:
            if prop.name == "family":
                return prop.value or None
    return None


def read_junit(path: Path) -> list[TestCase]:
    """Test cases of a pytest JUnit file; raises ValueError when it cannot be read or parsed."""
    from junitparser import Error, Failure, JUnitXml, Skipped

    try:
        data = read_capped(path, RESULTS_FILE_MAX_BYTES)
    except OSError as exc:
        raise ValueError(f"{path.name} is unreadable: {exc}") from None
    try:
        xml = JUnitXml.fromstring(data)
    except Exception as exc:  # junitparser surfaces lxml / ElementTree errors of several types
        raise ValueError(f"{path.name} is not valid JUnit XML: {exc}") from exc
    suites = xml if hasattr(xml, "__iter__") and not hasattr(xml, "classname") else [xml]
    cases = []
    for suite in suites:
        for case in suite:
            results = list(case.result)
            outcome, message = "passed", None
            for result in results:
                if isinstance(result, Failure):
                    outcome, message = "failed", result.message
                elif isinstance(result, Error):
                    outcome, message = "error", result.message
                elif isinstance(result, Skipped) and outcome == "passed":
                    outcome, message = "skipped", result.message
            cases.append(
                TestCase(
                    name=case.name,
                    classname=case.classname,
                    family=_family(case),
                    outcome=outcome,
                    time_s=float(case.time or 0.0),
                    message=message,
                )
            )
    return cases


def test_case(test: FinishedTest) -> TestCase:
    """A finished test as JUnit names it: tests/test_x.py::Class::test_y[p] is class tests.test_x.Class,
    name test_y[p]."""
    path, *scopes = test.nodeid.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return TestCase(
        name=scopes[-1] if scopes else path,
        classname=".".join([module, *scopes[:-1]]),
        family=test.family,
        outcome=test.outcome,
        time_s=test.duration_s,
        message=test.message,
    )


def read_cell(directory: Path) -> CellResults:
    results = CellResults(name=directory.name)
    results.outcome, _ = _load(results, directory, "cell.json", CellOutcome)
    results.interrupted, _ = _load(results, directory, INTERRUPTED, InterruptedRun)
    if not _present(directory / "cell.json") and results.interrupted is None:
        results.problems.append("cell.json is missing: the cell never recorded an outcome")
    manifest, results.manifest = _load(results, directory, "manifest.json", Manifest)
    resolution, _ = _load(results, directory, "resolution.json", list[ResolutionRecord])
    if resolution is None and not _present(directory / "resolution.json") and manifest is not None:
        resolution = manifest.resolution
    results.resolution = resolution or []
    if _present(directory / OUTCOMES):
        try:
            results.finished = read_finished(directory / OUTCOMES)
            results.recorded = [test_case(t) for t in results.finished]
        except (OSError, UnreadableFileError) as exc:
            results.problems.append(f"{OUTCOMES} is unreadable: {exc}")
    junit = directory / JUNIT
    results.junit_found = _present(junit)
    if results.junit_found:
        try:
            results.tests = read_junit(junit)
        except ValueError as exc:
            results.problems.append(str(exc))
    elif _present(directory / OUTCOMES):
        results.tests = results.recorded
        results.problems.append(
            f"junit.xml is missing: the {len(results.tests)} tests shown are those {OUTCOMES} recorded"
            " before the run ended"
        )
    results.bench, _ = _load(results, directory, "bench.json", BenchFile)
    results.kernels, _ = _load(results, directory, KERNELS, KernelsFile)
    results.accuracy, _ = _load(results, directory, ACCURACY, AccuracyFile)
    results.reruns, _ = _load(results, directory, RERUNS, RerunsFile)
    return results


def read_results(root: Path) -> list[CellResults]:
    """Every cell directory under root (results/), in name order; the root must exist (a mistyped
    --results is an error, not a matrix of cells that never ran)."""
    if not root.is_dir():
        raise FileNotFoundError(f"no results directory {root}")
    return [read_cell(d) for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith(".")]
