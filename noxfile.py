# /// script
# dependencies = ["nox>=2025.2.9", "pyyaml>=6", "pydantic>=2.6", "rich>=13", "jinja2>=3.1", "junitparser>=3.1",
#                 "docker>=7", "uv>=0.13", "packaging>=23", "filelock>=3.12"]
# ///
"""nox sessions.

- `tests`, `lint`, `kernels`: the project's own checks (what CI runs).
- one session per matrix.yaml cell, named after it (`nox -s npu-2610`), tagged by device kind and
  runtime (`nox -t npu`): host cells run in a fresh virtualenv of this checkout; docker cells build
  their image and run in it. `nox -s CELL -- --runtime host` runs a docker cell in the Python
  environment nox runs in instead (a GPU box without docker), as `gdn-matrix run CELL --runtime host`
  does. A cell that cannot run here is recorded as not run, with the reason, and the session is
  skipped (GDN_REQUIRE_RUN=1 makes it fail instead, for CI). Every cell session refreshes the report
  under results/report/.
- `report`: rebuild results/report/ from results/; `diff`: compare two report.json files.
- `lock`: refresh the cells' lock files (`nox -s lock -- [CELL ...]`); `nox -s lock -- --check`
  proves every pin exists for its platform and every lock still fits its cell (what CI runs).
- `constraints`: refresh constraints/sessions.txt, the versions every session installs.

The matrix is matrix.yaml, or the file $GDN_MATRIX names. When it does not load, the error is printed,
`tests`, `lint` and `kernels` still run, and the cell sessions are replaced by one session, `matrix`,
that fails with the error (as `report` does): a broken matrix.yaml must not hide what is wrong with it.

The block above makes nox install what the matrix code needs to read matrix.yaml before it defines
the sessions. Sessions make their virtualenvs with uv, which keeps one cache and hardlinks installed
files from it, so the sessions share one copy of torch. Every package a session installs is pinned
by constraints/sessions.txt (one resolution for Python >= 3.10 on every platform) except torch's
CUDA stack, which PyPI's torch pins itself, and Triton, which each session pins; each session ends
its install with `uv pip check`. Where torch comes from is gdn.matrix.torch_source: its CPU build
where PyTorch's CPU index answers or the wheelhouse has it, else PyPI's CUDA build, said once.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "src"))

from gdn.matrix import devices, torch_source  # noqa: E402 - needs src/
from gdn.matrix.cli import EXIT_NOT_RUN, REQUIRE_RUN_ENV  # noqa: E402
from gdn.matrix.config import (  # noqa: E402
    MATRIX_ENV,
    WHEELHOUSE_ENV,
    Cell,
    Matrix,
    MatrixConfigError,
    load_matrix,
    wheelhouse_dir,
)

CONSTRAINTS = "constraints/sessions.txt"
RESULTS = ROOT / "results"
REPORT = RESULTS / "report"
MATRIX_PATH = Path(os.environ.get(MATRIX_ENV) or ROOT / "matrix.yaml")
try:
    MATRIX: Matrix | None = load_matrix(MATRIX_PATH)
    MATRIX_ERROR = ""
except MatrixConfigError as exc:
    MATRIX, MATRIX_ERROR = None, str(exc)
    print(f"nox: the matrix cannot be used, its cell sessions are left out: {exc}", file=sys.stderr)
WHEELHOUSE = wheelhouse_dir(MATRIX, ROOT) if MATRIX else Path(os.environ.get(WHEELHOUSE_ENV) or ROOT / "wheelhouse")

# The Triton versions the matrix carries: triton-ascend's 3.2, the GPU stack's 3.6 and the index's
# latest, 3.9 (no block pointers). The kernels run under TRITON_INTERPRET=1 on the CPU.
TRITON_VERSIONS = ["3.2.0", "3.6.0", "3.9.0"]
# The local cell's Triton beside a CPU torch: the cpu cell's (PyPI's CUDA torch brings its own pin).
LOCAL_TRITON = TRITON_VERSIONS[-1]
# What the sessions install besides the project, its extras and Triton.
SESSION_TOOLS = ["ruff"]

nox.options.sessions = ["lint", "tests", "kernels"]
nox.options.default_venv_backend = "uv"
# CI logs show a cell's tests as they finish, not all at once when its process exits.
os.environ.setdefault("PYTHONUNBUFFERED", "1")
# nox logs at DEBUG by default, and at its own lower level with -v: docker-py's and urllib3's debug
# lines (every API call of a docker cell) are shown only with -v.
if logging.getLogger().level >= logging.DEBUG:
    for _name in ("docker", "urllib3"):
        logging.getLogger(_name).setLevel(logging.WARNING)


@functools.cache
def _torch_source(gpu: bool) -> torch_source.TorchSource:
    return torch_source.choose(WHEELHOUSE, gpu=gpu, env=os.environ)


_ANNOUNCED: set[str] = set()


def _announce(session: nox.Session, source: torch_source.TorchSource) -> None:
    """Said once per nox run, by the first session that installs torch from that source; a warning
    where it is PyPI's CUDA build on a machine whose sessions wanted the CPU one."""
    if source.description not in _ANNOUNCED:
        _ANNOUNCED.add(source.description)
        (session.warn if source.fallback else session.log)(source.description)


def install(session: nox.Session, *requirements: str, gpu: bool = False) -> None:
    """torch from its source, then `requirements` against the sessions' constraints, then `uv pip check`.
    torch goes first, alone: an index chosen for it (`--torch-backend`) would otherwise serve Triton
    too, and the CPU index has not every Triton."""
    source = _torch_source(gpu)
    _announce(session, source)
    without_backend = {torch_source.BACKEND_ENV: None}
    session.install("-c", CONSTRAINTS, source.requirement, *source.install_args, env=without_backend)
    session.install("-c", CONSTRAINTS, *requirements, env=without_backend)
    session.run("uv", "pip", "check", silent=True)


def cannot_run(session: nox.Session, reason: str) -> None:
    """Skip the session with the reason, or fail it where GDN_REQUIRE_RUN=1 asks every session to run
    (CI that expects a cell's device or docker engine, or torch's CPU build for the kernels, to be there)."""
    if os.environ.get(REQUIRE_RUN_ENV) == "1":
        session.error(f"{reason} ({REQUIRE_RUN_ENV}=1: a session that cannot run here fails)")
    session.skip(reason)


def workers() -> str:
    return os.environ.get("GDN_TEST_WORKERS", "auto")


@nox.session
def tests(session: nox.Session) -> None:
    """The project's test suite on CPU (pytest-xdist across the cores)."""
    install(session, "-e", ".[test,matrix]")
    session.run("pytest", "-n", workers(), *session.posargs)


# Besides the kernels' own tests: the grpo family, whose GRPO step trains through the chunk kernels
# (triton against eager, padded and packed, at tiny sizes), the fla adapter's, and the stride and
# signature tests, whose triton half runs only where triton imports.
KERNEL_TESTS = [
    "tests/ops/test_grpo.py",
    "tests/backends/fla/test_fla_backend.py",
    "tests/ops/test_strides.py",
    "tests/ops/test_signatures.py",
]


@nox.session
@nox.parametrize("triton", TRITON_VERSIONS)
def kernels(session: nox.Session, triton: str) -> None:
    """The bundled Triton kernels' tests under the Triton interpreter, for each Triton version."""
    source = _torch_source(gpu=False)
    if source.cpu_build is False:
        # PyPI's CUDA torch pins its own Triton (3.7.1 for 2.13): another one beside it breaks that pin
        cannot_run(
            session,
            f"needs torch's CPU build, which pins no Triton ({source.description}); set "
            f"{torch_source.BACKEND_ENV}=cpu where PyTorch's index is reachable, or put its CPU wheel in {WHEELHOUSE}",
        )
    install(session, "-e", ".[test]", f"triton=={triton}")
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "backends" / "triton").glob("test_*.py"))
    files += KERNEL_TESTS
    # These sessions exist to test triton: its grpo comparison failing to run (an install or a probe
    # rejection making it skip or fall back to eager) fails rather than passing as skipped.
    env = {"TRITON_INTERPRET": "1", "GDN_EXPECT_MODES": "triton"}
    session.run("pytest", "-n", workers(), *files, *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff's checks and format check over the whole checkout."""
    session.install("-c", CONSTRAINTS, *SESSION_TOOLS)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=False)
def constraints(session: nox.Session) -> None:
    """Refresh constraints/sessions.txt (reads torch's CPU wheel in the wheelhouse for its metadata)."""
    from gdn.matrix.lock import uv_binary

    wheel = torch_source.cpu_wheel(WHEELHOUSE)
    if wheel is None:
        session.error(
            f"the CPU wheel of torch {torch_source.TORCH} is not in {WHEELHOUSE}: `pip download --no-deps -d "
            f"{WHEELHOUSE} torch=={torch_source.TORCH} --index-url {torch_source.CPU_INDEX}`"
        )
    with tempfile.TemporaryDirectory(prefix="gdn-constraints-") as scratch:
        # resolved as if torch were its CPU build everywhere: no CUDA stack, no Triton pin to inherit
        config = Path(scratch) / "uv.toml"
        config.write_text(torch_source.cpu_metadata_config(wheel))
        command = [uv_binary(), "pip", "compile", "pyproject.toml", "-", "--extra", "test", "--extra", "matrix"]
        command += ["--universal", "--python-version", "3.10", "--config-file", str(config), "--quiet"]
        command += ["--no-emit-package", "gdn-matrix", "--custom-compile-command", "nox -s constraints"]
        command += ["-o", CONSTRAINTS]
        session.log(" ".join(command))
        # the extra requirements come on stdin, so that no scratch path lands in the file's annotations
        requirements = "\n".join([f"torch=={torch_source.TORCH}", *SESSION_TOOLS]) + "\n"
        env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
        done = subprocess.run(command, cwd=ROOT, input=requirements, text=True, env=env, check=False)
    if done.returncode:
        session.error(f"uv pip compile exited with {done.returncode}")


def loaded_matrix(session: nox.Session) -> Matrix:
    if MATRIX is None:
        session.error(f"the matrix cannot be used: {MATRIX_ERROR}")
    return MATRIX


def refresh_report(session: nox.Session) -> None:
    from gdn.matrix.report import write_report
    from gdn.matrix.report_build import build_report

    try:
        report = build_report(RESULTS, loaded_matrix(session))
    except FileNotFoundError as exc:  # no cell has run here yet: there is nothing to report
        session.skip(str(exc))
    paths = write_report(report, REPORT)
    session.log("report: " + ", ".join(str(p.relative_to(ROOT)) for p in paths.values()))


def gpu_present() -> bool:
    """An NVIDIA GPU on this machine: the host cells run the bundled kernels on it."""
    return devices.kind("cuda").absent_reason() is None


def host_cell(cell: Cell):
    def session_fn(session: nox.Session) -> None:
        gpu = gpu_present()
        # A CPU torch pins no Triton: the session pins the cpu cell's; PyPI's CUDA torch brings its own.
        triton = [f"triton=={LOCAL_TRITON}"] if _torch_source(gpu).cpu_build else []
        install(session, "-e", ".[test,matrix,triton]", *triton, gpu=gpu)
        # Without a GPU the triton backend serves the CPU through Triton's interpreter.
        env = {} if gpu else {"TRITON_INTERPRET": "1"}
        # The outcome is read back from cell.json, the source of truth, rather than an exit status.
        session.run(
            "gdn-matrix",
            "run",
            cell.name,
            "--results",
            str(RESULTS),
            "--root",
            str(ROOT),
            *session.posargs,
            success_codes=[0, 1, 2, EXIT_NOT_RUN],
            env=env,
        )
        finish(session, cell)

    return session_fn


def requested_runtime(session: nox.Session) -> str | None:
    """`-- --runtime host`: the runtime to run the cell in instead of its own."""
    parser = argparse.ArgumentParser(prog=f"nox -s {session.name} --")
    parser.add_argument("--runtime", metavar="{docker,host}")
    return parser.parse_args(session.posargs).runtime


def docker_cell(cell: Cell):
    def session_fn(session: nox.Session) -> None:
        from gdn.matrix.cell import CellInterruptedError, run_cell

        # In the host runtime the cell runs in this interpreter's environment: the one nox runs in.
        try:
            run_cell(loaded_matrix(session), cell, ROOT, RESULTS, echo=session.log, runtime=requested_runtime(session))
        except (MatrixConfigError, CellInterruptedError) as exc:
            session.error(str(exc))
        finish(session, cell)

    return session_fn


def finish(session: nox.Session, cell: Cell) -> None:
    refresh_report(session)
    outcome = json.loads((RESULTS / cell.name / "cell.json").read_text())
    reason = f": {outcome['reason']}" if outcome.get("reason") else ""
    if outcome["status"] == "not_run":
        cannot_run(session, f"cell {cell.name} not run{reason}")
    if outcome["status"] != "passed":
        session.error(f"cell {cell.name} {outcome['status']}{reason} (see results/report/report.md)")


for _cell in MATRIX.cells if MATRIX else ():
    _fn = host_cell(_cell) if _cell.runtime == "host" else docker_cell(_cell)
    _fn.__doc__ = f"matrix cell ({_cell.device}, {_cell.runtime}): {_cell.description}"
    nox.session(name=_cell.name, tags=[_cell.device, _cell.runtime], python=None if _cell.runtime == "host" else False)(
        _fn
    )

if MATRIX is None:

    @nox.session(python=False)
    def matrix(session: nox.Session) -> None:
        """Stands in for the cell sessions while the matrix does not load: fails with its error."""
        loaded_matrix(session)


@nox.session(python=False)
def report(session: nox.Session) -> None:
    """Rebuild results/report/ (report.json, report.md, report.html) from results/."""
    refresh_report(session)


@nox.session(python=False)
def lock(session: nox.Session) -> None:
    """Refresh locks/<cell>.txt: `nox -s lock [-- CELL ...]`; check pins and locks: `nox -s lock -- --check`."""
    from gdn.matrix.lock import main as lock_main

    code = lock_main(["--root", str(ROOT), "--matrix", str(MATRIX_PATH), *session.posargs])
    if code:
        session.error(f"gdn-matrix lock exited with {code}")


@nox.session(python=False)
def diff(session: nox.Session) -> None:
    """Compare two report.json files: `nox -s diff -- OLD NEW [--threshold 0.1] [--no-fail]`."""
    from gdn.matrix.diff import main as diff_main

    code = diff_main(session.posargs)
    if code:
        session.error(f"gdn-matrix diff exited with {code}")
