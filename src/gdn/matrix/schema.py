"""The typed models of every file that passes between the matrix's stages, and their JSON Schemas.

    cell.json         CellOutcome      written by the cell runner (gdn.matrix.cell)
    interrupted.json  InterruptedRun   written beside the last complete result when a run is interrupted
    manifest.json     Manifest         written by the probe inside the cell (gdn.matrix.probe)
    resolution.json   ResolutionRecord list, the manifest's resolution records alone
    bench.json        BenchFile        written by the cell's benchmark (gdn.matrix.bench)
    kernels.json      KernelsFile      what each step of the run really ran (gdn.matrix.kernels)
    accuracy.json     AccuracyFile     each backend's error against an fp64 reference (gdn.matrix.accuracy)
    report.json       Report           written by `gdn-matrix report`, read by `gdn-matrix diff`
    entry.json        HistoryEntry     one report kept in a history (gdn.matrix.history)
    bisect.json       BisectResult     which package between two locks flips a cell's tests (gdn.matrix.bisect)
    reruns.json       RerunsFile       the reruns of a cell's failing tests and their labels (gdn.matrix.reruns)

The models are plain dataclasses and this module imports nothing outside the standard library, so the
writers inside a cell (whose image carries only torch, the test tools and the stack under test) use
them without pydantic. Readers validate with pydantic (`load`), in strict JSON mode: a field of the
wrong type is an error naming the file and the field, never a value coerced into something else.
A file is read within its size cap and only when it is a regular file, and NaN, infinities and
nesting past a limit are refused first (gdn.matrix.jsonio). Keys a model does not name are allowed
and ignored (a newer writer may add some).
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from gdn.matrix.jsonio import (
    RESULTS_FILE_MAX_BYTES,
    UnreadableFileError,
    location,
    parse_json,
    read_capped,
    write_json,
)

CELL_SCHEMA = 1
BENCH_SCHEMA = 2
KERNELS_SCHEMA = 1
ACCURACY_SCHEMA = 1
REPORT_SCHEMA = 1
HISTORY_SCHEMA = 1
BISECT_SCHEMA = 1
RERUNS_SCHEMA = 1

# "flaky": tests failed, and every failure passed when rerun with its own seed (gdn.matrix.reruns)
Status = Literal["passed", "flaky", "failed", "error", "timeout", "build_failed", "not_run"]
# a report's status of a cell adds "interrupted": a run was interrupted and no complete run is recorded
ReportStatus = Literal["passed", "flaky", "failed", "error", "timeout", "build_failed", "not_run", "interrupted"]
# torch_npu's test-result vocabulary, per cell (its parser records one of these per test file)
Verdict = Literal["PASSED", "FAILED", "CRASHED", "TIMEOUT", "MISSING"]
Pass = Literal["fwd", "fwd+bwd", "decode"]
TestOutcome = Literal["passed", "failed", "error", "skipped"]
# what the reruns of a failing test showed (gdn.matrix.reruns): it failed every rerun, with its own seed
# and fresh ones (deterministic); it failed with its own seed every time and passed with a fresh one
# (seed_dependent); it passed with its own seed (flaky); it was not rerun enough to tell (not_rerun)
FailureLabel = Literal["deterministic", "seed_dependent", "flaky", "not_rerun"]


class SchemaError(ValueError):
    """A file that does not validate against its model; the message names the file and the field."""


# ---------------------------------------------------------------- cell.json, interrupted.json


@dataclass
class PinDifference:
    """A pin of the cell (matrix.yaml `versions`) that the environment it ran in does not have."""

    package: str
    pinned: str
    # the version found, "not installed", or "unknown (...)" where the probe could not tell
    found: str


@dataclass
class CellLock:
    """The cell's lock as the report shows it."""

    digest: str
    packages: dict[str, str] = field(default_factory=dict)


@dataclass
class CellOutcome:
    """cell.json: how the cell's last complete run went."""

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
    lock: CellLock | None = None
    # None: not compared (no manifest: the cell did not get to its probe)
    pin_differences: list[PinDifference] | None = None
    schema: int = CELL_SCHEMA

    def write(self, directory: Path) -> None:
        write_json(directory / "cell.json", asdict(self))


@dataclass
class InterruptedRun:
    """interrupted.json: a run stopped by a signal. It sits beside the last complete run's files, which
    it never replaces; the next complete run of the cell clears it."""

    cell: str
    signal: str
    started_at: str
    interrupted_at: str
    reason: str
    log_tail: str | None = None
    # the tests it finished before it was stopped (its tests.jsonl): counts by outcome, and the failed
    # and errored ones ("nodeid: message"), since junit.xml is written only when pytest ends
    tests_finished: dict[str, int] = field(default_factory=dict)
    tests_failed: list[str] = field(default_factory=list)
    # no signal was seen: the runner itself died (SIGKILL, the OOM killer), and the next run of the cell
    # or the report found the marker it left (gdn.matrix.runs); `signal` is then "unknown"
    runner_died: bool = False
    schema: int = CELL_SCHEMA


# ---------------------------------------------------------------- manifest.json, resolution.json


@dataclass
class Rejection:
    backend: str | None = None
    reason: str | None = None


@dataclass
class ResolutionRecord:
    """One (op, device) resolution as gdn.resolve records it, or the error that stopped it."""

    op: str
    device: str
    backend: str | None = None
    route: str | None = None
    rejected: list[Rejection] = field(default_factory=list)
    # the backends never tried and why (another compute mode, a device they do not serve, not in auto)
    not_candidates: list[Rejection] = field(default_factory=list)
    error: str | None = None


Section = dict[str, Any]


@dataclass
class Manifest:
    """manifest.json (gdn.matrix.probe): the sections the report reads are typed as objects (a section the
    probe could not fill is {"error": ...}); everything else the probe records is allowed as is."""

    python: Section | None = None
    torch: Section | None = None
    triton: Section | None = None
    torch_npu: Section | None = None
    cann: Section | None = None
    fla_npu: Section | None = None
    fla: Section | None = None
    transformers: Section | None = None
    devices: Section | None = None
    resolution: list[ResolutionRecord] | None = None


# ---------------------------------------------------------------- kernels.json


@dataclass
class KernelCount:
    """One kind of call and how many were made (gdn.kernel_log.KernelEntry): at `level` ("gdn", or a
    peer's own dispatch: "fla", "flash_qla"), `function` (a gdn op, or the peer's operation.function,
    e.g. "common.chunk_bwd_dqkwg") with inputs of `dtype` ran `ran` (a gdn route such as
    "triton:bundled", or the peer's backend: "triton" is fla's own function), after the candidates in
    `passed_over` declined it; `during` says what the process was doing when not serving a call of the
    step's own (gdn's numeric probe of a backend)."""

    level: str
    function: str
    dtype: str
    ran: str
    calls: int
    passed_over: list[Rejection] = field(default_factory=list)
    during: str | None = None


@dataclass
class KernelsFile:
    """kernels.json: per step of the cell's run ("tests", "accuracy", "bench"), every kind of call it made."""

    steps: dict[str, list[KernelCount]] = field(default_factory=dict)
    schema: int = KERNELS_SCHEMA


# ---------------------------------------------------------------- accuracy.json

AccuracyStatus = Literal["measured", "refused", "error", "not_run"]


@dataclass
class AccuracyRow:
    """One backend on one case: `errors` maps each quantity the op's case compares (o, final_state, dq,
    ..., pool, conv_state) to ||out - ref|| / ||ref|| against the fp64 reference, None where the output
    is not finite. `status` says why a row has no errors: the backend refused the call (`reason`), raised
    (`reason`), or the time budget was spent. `kernels` is what the row's calls ran,
    at every dispatch level."""

    op: str
    backend: str
    dtype: str
    status: AccuracyStatus
    regime: str | None = None
    layout: str | None = None
    route: str | None = None
    errors: dict[str, float | None] = field(default_factory=dict)
    reason: str | None = None
    kernels: list[KernelCount] = field(default_factory=list)


@dataclass
class AccuracyFile:
    """accuracy.json (`gdn-matrix accuracy`): every backend that serves each op on the device, against
    fp64 references (gdn.matrix.accuracy.reference), at the shapes in `shape`; the backends that declare
    the device but cannot run here are in `unavailable`, with the reason."""

    device: str
    shape: dict[str, int]
    rows: list[AccuracyRow]
    unavailable: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float | None = None
    budget_s: float | None = None
    schema: int = ACCURACY_SCHEMA


# ---------------------------------------------------------------- reruns.json


@dataclass
class RerunAttempt:
    """One rerun of a failing test: the seed it ran with (None: the test draws none), whether that seed
    was a fresh one or the failure's own, what it gave and how long it took."""

    seed: int | None
    fresh_seed: bool
    outcome: TestOutcome
    duration_s: float
    message: str | None = None


@dataclass
class FailureRerun:
    """A failing test of the cell's run (its pytest node id), its reruns and the label they give."""

    test: str
    outcome: Literal["failed", "error"]
    label: FailureLabel
    seed: int | None = None
    # why a test was not rerun enough to tell, or what settled its label
    reason: str | None = None
    attempts: list[RerunAttempt] = field(default_factory=list)


@dataclass
class RerunsFile:
    """reruns.json: the failing tests of the cell's run, each rerun in the cell's own runtime (its own
    seed first, then fresh seeds) within the bounds recorded here, and the label the reruns give.
    `finished` is False while the reruns run: a cell killed meanwhile leaves the labels so far."""

    failures: list[FailureRerun]
    max_tests: int
    same_seed_reruns: int
    fresh_seed_reruns: int
    budget_s: float
    elapsed_s: float = 0.0
    finished: bool = False
    schema: int = RERUNS_SCHEMA

    def write(self, directory: Path) -> None:
        write_json(directory / "reruns.json", asdict(self))


# ---------------------------------------------------------------- bench.json


def _bench_alias(name: str) -> str:
    # `pass` is a keyword: the field is pass_ in Python and "pass" in the file
    return "pass" if name == "pass_" else name


@dataclass
class BenchRow:
    """One timing, or the reason there is none (backend unavailable or rejected, budget spent).

    `implementation` is what actually ran: the resolved route (e.g. "triton:bundled", "fla:0.6.0") and,
    for a peer that dispatches on its own, the kernel it chose ("fla:0.6.0 -> flash_qla").
    `ratio_to_fastest` is ms over the fastest timed backend of the same (op, shape, pass)."""

    __pydantic_config__ = {"alias_generator": _bench_alias}  # noqa: RUF012 - pydantic reads a plain dict

    op: str
    backend: str
    shape: dict[str, int]
    pass_: Pass
    implementation: str | None = None
    ms: float | None = None
    peak_gib: float | None = None
    ratio_to_fastest: float | None = None
    first_call_s: float | None = None
    reason: str | None = None
    note: str | None = None

    def key(self) -> tuple[str, str, str, str]:
        return (self.op, self.backend, shape_text(self.shape), self.pass_)

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["pass"] = data.pop("pass_")
        return data


@dataclass
class LegacyBenchRow:
    """A row of the older untyped form ({"op", "impl", "shape", "ms"}): plotted, not in speed tables."""

    op: str
    impl: str
    shape: Any = None
    ms: float | str | None = None


@dataclass
class BenchFile:
    """bench.json."""

    rows: list[BenchRow | LegacyBenchRow]
    environment: dict[str, Any] = field(default_factory=dict)
    schema: int = BENCH_SCHEMA
    budget_s: float | None = None
    elapsed_s: float | None = None
    # the warm-up before the timing (the peers' first calls, in parallel): its cap and how long it took
    warm_up_s: float | None = None
    warm_up_elapsed_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "environment": self.environment,
            "budget_s": self.budget_s,
            "elapsed_s": self.elapsed_s,
            "warm_up_s": self.warm_up_s,
            "warm_up_elapsed_s": self.warm_up_elapsed_s,
            "rows": [row.to_json() for row in self.rows if isinstance(row, BenchRow)],
        }


def shape_text(shape: dict[str, int]) -> str:
    """B=4 T=4096 H=16 HV=32 K=V=128 (K and V merged when equal)."""
    parts = dict(shape)
    if "K" in parts and parts.get("K") == parts.get("V"):
        parts["K=V"] = parts.pop("K")
        parts.pop("V")
    return " ".join(f"{k}={v}" for k, v in parts.items())


# ---------------------------------------------------------------- report.json


@dataclass
class ResolutionEntry:
    backend: str | None = None
    route: str | None = None
    rejected: list[Rejection] = field(default_factory=list)
    not_candidates: list[Rejection] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As report.json has it: a resolution that failed has its error and nothing else."""
        if self.error is not None:
            return {"backend": None, "route": None, "error": self.error}
        data = asdict(self)
        del data["error"]
        return data


@dataclass
class FamilyCounts:
    passed: int = 0
    failed: int = 0
    error: int = 0
    skipped: int = 0
    total: int = 0


@dataclass
class Failure:
    test: str
    outcome: Literal["failed", "error"]
    family: str | None = None
    message: str | None = None
    # what the test's calls ran, at every dispatch level (tests.jsonl, where the kernel log recorded it)
    kernels: list[KernelCount] = field(default_factory=list)
    # the seed its inputs were drawn with (GDN_TEST_SEED=<seed> replays it), where it drew one
    seed: int | None = None
    # what its reruns showed (reruns.json); None in a report made before reruns were recorded
    label: FailureLabel | None = None
    label_reason: str | None = None
    reruns: list[RerunAttempt] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        # report.json's order: the family beside the test's name
        order = ("test", "family", "outcome", "message", "seed", "label", "label_reason", "reruns", "kernels")
        return {key: data[key] for key in order}


@dataclass
class Comparison:
    """A test that compared one backend with another: the ops `mode` served (op -> route), the ops that
    fell back to another (op -> what served them and why) and the test's cases it did not compare (case
    -> why; None where the test names no cases). Its verdict holds for `compared` in the other cases."""

    test: str
    outcome: TestOutcome
    mode: str | None = None
    compared: dict[str, str] = field(default_factory=dict)
    fell_back: dict[str, str] = field(default_factory=dict)
    not_compared: dict[str, str] | None = None


@dataclass
class Expectation:
    op: str
    backend: str
    route: str | None = None
    actual_backend: str | None = None
    actual_route: str | None = None
    # None: not checked (the cell resolved nothing)
    ok: bool | None = None


@dataclass
class ReportCell:
    """One cell of report.json."""

    name: str
    status: ReportStatus
    reason: str | None = None
    verdict: Verdict | None = None
    device: str | None = None
    runtime: str | None = None
    matrix_runtime: str | None = None
    real_hardware: bool | None = None
    cards: list[str] = field(default_factory=list)
    stand_ins: list[str] = field(default_factory=list)
    duration_s: float | None = None
    image: str | None = None
    image_built: bool | None = None
    exit_code: int | None = None
    log_tail: str | None = None
    lock: CellLock | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    pin_differences: list[PinDifference] | None = None
    # op -> torch device -> what resolved there
    resolution: dict[str, dict[str, ResolutionEntry]] = field(default_factory=dict)
    families: dict[str, FamilyCounts] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    # bench.json's rows as written (typed rows are validated again by gdn.matrix.speed)
    bench: list[dict[str, Any]] | None = None
    peer_kernels: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    # kernels.json: per step of the run (tests, accuracy, bench), what its calls ran
    kernels: dict[str, list[KernelCount]] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    accuracy: AccuracyFile | None = None
    expectations: list[Expectation] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    interrupted: InterruptedRun | None = None


@dataclass
class Report:
    """report.json."""

    schema: int
    generated_at: str
    ops: list[str]
    cells: list[ReportCell]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for cell, written in zip(self.cells, data["cells"], strict=True):
            written["resolution"] = {
                op: {device: entry.to_json() for device, entry in per_device.items()}
                for op, per_device in cell.resolution.items()
            }
            written["failures"] = [failure.to_json() for failure in cell.failures]
        return data


# ---------------------------------------------------------------- a history's entry.json


@dataclass
class KeptFile:
    """A file of a report kept in a history entry: its path in the entry (`report.json`,
    `local/manifest.json`), its size and its sha256."""

    path: str
    bytes: int
    sha256: str


@dataclass
class HistoryEntry:
    """entry.json: one report kept in a history directory (`gdn-matrix history add`). `key` is the
    entry's directory, from the report's generated time and `digest`, the sha256 of what it keeps (each
    file's path and sha256): the same report added twice is one entry. `left_out` names each cell file
    that was not kept, with the reason (past the size cap, not a regular file)."""

    key: str
    generated_at: str
    digest: str
    added_at: str
    files: list[KeptFile]
    cells: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    schema: int = HISTORY_SCHEMA

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def write(self, directory: Path) -> None:
        write_json(directory / "entry.json", asdict(self))


# ---------------------------------------------------------------- bisect.json

# pass / fail: the tests' verdict in an environment; broken: no verdict (the environment did not
# install, its dependencies do not hold together, or pytest could not run the tests)
StepOutcome = Literal["pass", "fail", "broken"]
# found: a change (or a group that goes together) flips the result; no_failure: the bad lock passes;
# good_fails: the good lock fails too; unusable: an end lock's own environment is broken
BisectVerdict = Literal["found", "no_failure", "good_fails", "unusable"]


@dataclass
class PackageChange:
    """One package that differs between the two locks: `good` None for one the bad lock adds, `bad`
    None for one it removes."""

    name: str
    good: str | None
    bad: str | None

    def describe(self) -> str:
        if self.good is None:
            return f"{self.name} (added) {self.bad}"
        if self.bad is None:
            return f"{self.name} {self.good} (removed)"
        return f"{self.name} {self.good} -> {self.bad}"


@dataclass
class BisectStep:
    """One environment built and tested: the changes taken from the bad lock (every other package is
    the good lock's), what came of it and how long it took. `conflicts` are the unmet requirements uv's
    check named (`requirer needs requirement`)."""

    number: int
    from_bad: list[str]
    outcome: StepOutcome
    duration_s: float
    detail: str = ""
    conflicts: list[str] = field(default_factory=list)


@dataclass
class BisectResult:
    """bisect.json: the search between two locks of a cell. `culprit` is the smallest set of changes
    found to flip the tests from passing to failing: one package, or a group that only installs
    together."""

    cell: str
    good_lock: str
    bad_lock: str
    tests: list[str]
    changes: list[PackageChange]
    verdict: BisectVerdict
    steps: list[BisectStep]
    culprit: list[PackageChange] = field(default_factory=list)
    duration_s: float = 0.0
    schema: int = BISECT_SCHEMA

    def write(self, path: Path) -> None:
        write_json(path, asdict(self))


# ---------------------------------------------------------------- reading and publishing

MODELS: dict[str, Any] = {
    "cell": CellOutcome,
    "interrupted": InterruptedRun,
    "manifest": Manifest,
    "resolution": list[ResolutionRecord],
    "bench": BenchFile,
    "kernels": KernelsFile,
    "accuracy": AccuracyFile,
    "report": Report,
    "history_entry": HistoryEntry,
    "bisect": BisectResult,
    "reruns": RerunsFile,
}


@functools.cache
def _adapter(model: Any) -> Any:
    """One validator per model: building one costs far more than a small file's validation."""
    from pydantic import TypeAdapter

    return TypeAdapter(model)


def load(model: Any, text: str | bytes, source: str) -> Any:
    """`text` validated as `model`; SchemaError names `source` (the file) and the first field at fault."""
    from pydantic import ValidationError

    try:
        return _adapter(model).validate_json(text, strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise SchemaError(f"{source}: {location(first['loc'])}: {first['msg']}{more}") from None


def load_file(model: Any, path: Path, limit: int = RESULTS_FILE_MAX_BYTES) -> tuple[Any, Any]:
    """The file validated as `model`, and its JSON as written (for the sections a model leaves open).
    SchemaError says why not: not a regular file, past `limit` bytes, not strict JSON, not the model."""
    try:
        data = read_capped(path, limit)
        value = parse_json(data, path.name)
    except OSError as exc:
        raise SchemaError(f"{path.name} is unreadable: {exc}") from None
    except UnreadableFileError as exc:
        raise SchemaError(str(exc)) from None
    return load(model, data, path.name), value


def json_schema(name: str) -> dict[str, Any]:
    from pydantic import TypeAdapter

    schema = TypeAdapter(MODELS[name]).json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def schema_text(name: str) -> str:
    return json.dumps(json_schema(name), indent=2) + "\n"
