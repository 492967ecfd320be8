"""What a cell leaves under results/<cell>/ and how it is read back.

    cell.json        the outcome (always written, whatever happened): status, reason, timings, image,
                     exit code, log tail, whether it ran on real accelerator hardware or with stand-ins,
                     the runtime it ran in beside matrix.yaml's, and its pins that the environment lacked
    manifest.json    `python -m gdn.probe --json` inside the cell (versions, devices, resolutions)
    resolution.json  the resolution records alone (gdn.resolutions())
    junit.xml        pytest --junitxml
    bench.json       optional: {"rows": [{"op", "impl", "shape", "ms", ...}]}
    log.txt          everything the cell printed

Reading never fails as a whole: a missing or malformed file becomes a problem noted on that cell,
and every other file (and every other cell) is still read.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

SCHEMA = 1
STATUSES = ("passed", "failed", "error", "timeout", "build_failed", "not_run")
Status = Literal["passed", "failed", "error", "timeout", "build_failed", "not_run"]
FAMILY_MARKERS = ("probe", "single_op", "shape_grid", "grpo")


def atomic_write(path: Path, text: str) -> None:
    """Write through a temporary file in the same directory and rename it over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, payload: Any) -> None:
    atomic_write(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


@dataclass
class PinDifference:
    """A pin of the cell (matrix.yaml `versions`) that the environment it ran in does not have."""

    package: str
    pinned: str
    # the version found, "not installed", or "unknown (...)" where the probe could not tell
    found: str


@dataclass
class CellOutcome:
    """cell.json."""

    cell: str
    status: Status
    device: str
    # the runtime the cell ran in, and the one matrix.yaml gives it (they differ for a docker cell run
    # on the host: then its results are the host's, not its image's)
    runtime: str
    matrix_runtime: str | None = None
    reason: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    image: str | None = None
    image_built: bool | None = None
    exit_code: int | None = None
    log_tail: str | None = None
    real_hardware: bool = False
    stand_ins: list[str] = field(default_factory=list)
    families: list[str] = field(default_factory=list)
    # the cell's lock as the report shows it: {"digest": "sha256:...", "packages": {name: version}}
    lock: dict[str, Any] | None = None
    # None: not compared (no manifest: the cell did not get to its probe)
    pin_differences: list[PinDifference] | None = None
    schema: int = SCHEMA

    def write(self, directory: Path) -> None:
        write_json(directory / "cell.json", asdict(self))


@dataclass
class TestCase:
    name: str
    classname: str
    family: str | None
    outcome: Literal["passed", "failed", "error", "skipped"]
    time_s: float
    message: str | None = None


@dataclass
class CellResults:
    """Everything read back from one results/<cell>/ directory."""

    name: str
    outcome: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    resolution: list[dict[str, Any]] = field(default_factory=list)
    tests: list[TestCase] = field(default_factory=list)
    bench: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)


def _read_json(directory: Path, name: str, problems: list[str]) -> Any:
    path = directory / name
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        problems.append(f"{name} is unreadable: {exc}")
        return None


def _family(case) -> str | None:
    """The test family tests/conftest.py records on every test case as a JUnit property."""
    from junitparser import Properties

    for properties in case.iterchildren(Properties):
        for prop in properties:
            if prop.name == "family":
                return prop.value or None
    return None


def read_junit(path: Path) -> list[TestCase]:
    """Test cases of a pytest JUnit file; raises ValueError when it cannot be parsed."""
    from junitparser import Error, Failure, JUnitXml, Skipped

    try:
        xml = JUnitXml.fromfile(str(path))
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


def read_cell(directory: Path) -> CellResults:
    results = CellResults(name=directory.name)
    problems = results.problems
    results.outcome = _read_json(directory, "cell.json", problems)
    if results.outcome is None and not problems:
        problems.append("cell.json is missing: the cell never recorded an outcome")
    results.manifest = _read_json(directory, "manifest.json", problems)
    resolution = _read_json(directory, "resolution.json", problems)
    if resolution is None and results.manifest:
        resolution = results.manifest.get("resolution")
    results.resolution = resolution if isinstance(resolution, list) else []
    junit = directory / "junit.xml"
    if junit.exists():
        try:
            results.tests = read_junit(junit)
        except ValueError as exc:
            problems.append(str(exc))
    results.bench = _read_json(directory, "bench.json", problems)
    return results


def read_results(root: Path) -> list[CellResults]:
    """Every cell directory under root (results/), in name order."""
    if not root.is_dir():
        return []
    return [read_cell(d) for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith(".")]
