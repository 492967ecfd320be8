# /// script
# dependencies = ["nox>=2025.2.9", "pyyaml>=6", "pydantic>=2.6", "rich>=13", "jinja2>=3.1", "junitparser>=3.1",
#                 "docker>=7", "uv>=0.13", "packaging>=23", "filelock>=3.12"]
# ///
"""nox sessions.

- `tests`, `lint`: the project's own checks (what CI runs).
- one session per matrix.yaml cell, named after it (`nox -s npu-2610`), tagged by device kind and
  runtime (`nox -t npu`): host cells run in a fresh virtualenv of this checkout; docker cells build
  their image and run in it. `nox -s CELL -- --runtime host` runs a docker cell in the Python
  environment nox runs in instead (a GPU box without docker), as `gdn-matrix run CELL --runtime host`
  does. A cell that cannot run here is recorded as not run, with the reason, and the session is
  skipped. Every cell session refreshes the report under results/report/.
- `report`: rebuild results/report/ from results/; `diff`: compare two report.json files.

- `lock`: refresh the cells' lock files (`nox -s lock -- [CELL ...]`); `nox -s lock -- --check`
  proves every pin exists for its platform and every lock still fits its cell (what CI runs).

The matrix is matrix.yaml, or the file $GDN_MATRIX names. When it does not load, the error is printed,
`tests`, `lint` and `kernels` still run, and the cell sessions are replaced by one session, `matrix`,
that fails with the error (as `report` does): a broken matrix.yaml must not hide what is wrong with it.

The block above makes nox install what the matrix code needs to read matrix.yaml before it defines
the sessions. CPU environments install torch through constraints/cpu.txt so that no multi-GB CUDA
build is ever pulled onto a machine without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "src"))

from gdn.matrix.config import MATRIX_ENV, Cell, Matrix, MatrixConfigError, load_matrix  # noqa: E402 - needs src/

CPU_CONSTRAINTS = str(ROOT / "constraints" / "cpu.txt")
RESULTS = ROOT / "results"
REPORT = RESULTS / "report"
MATRIX_PATH = Path(os.environ.get(MATRIX_ENV) or ROOT / "matrix.yaml")
try:
    MATRIX: Matrix | None = load_matrix(MATRIX_PATH)
    MATRIX_ERROR = ""
except MatrixConfigError as exc:
    MATRIX, MATRIX_ERROR = None, str(exc)
    print(f"nox: the matrix cannot be used, its cell sessions are left out: {exc}", file=sys.stderr)
EXIT_NOT_RUN = 3  # gdn.matrix.cli: the cell could not run here

nox.options.sessions = ["lint", "tests", "kernels"]
nox.options.default_venv_backend = "venv"


def install_project(session: nox.Session, extras: str = "test") -> None:
    session.install("-c", CPU_CONSTRAINTS, "-e", f".[{extras}]")


def workers() -> str:
    return os.environ.get("GDN_TEST_WORKERS", "auto")


@nox.session
def tests(session: nox.Session) -> None:
    """The project's test suite on CPU (pytest-xdist across the cores)."""
    install_project(session, "test,matrix")
    session.run("pytest", "-n", workers(), *session.posargs)


# The Triton versions the matrix carries: triton-ascend's 3.2, the GPU stack's 3.6 and the index's
# latest, 3.9 (no block pointers). The kernels run under TRITON_INTERPRET=1 on the CPU.
TRITON_VERSIONS = ["3.2.0", "3.6.0", "3.9.0"]
# Besides the kernels' own tests: the grpo family, whose GRPO step trains through the chunk kernels
# (triton against eager, padded and packed, at tiny sizes), the fla adapter's, and the stride and
# signature tests, whose triton half runs only where triton imports.
KERNEL_TESTS = ["tests/test_grpo.py", "tests/test_fla_backend.py", "tests/test_strides.py", "tests/test_signatures.py"]


@nox.session
@nox.parametrize("triton", TRITON_VERSIONS)
def kernels(session: nox.Session, triton: str) -> None:
    """The bundled Triton kernels' tests under the Triton interpreter, for each Triton version."""
    install_project(session, "test")
    session.install("-c", CPU_CONSTRAINTS, f"triton=={triton}")
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_triton_*.py"))
    files += KERNEL_TESTS
    # These sessions exist to test triton: its grpo comparison failing to run (an install or a probe
    # rejection making it skip or fall back to eager) fails rather than passing as skipped.
    env = {"TRITON_INTERPRET": "1", "GDN_EXPECT_MODES": "triton"}
    session.run("pytest", "-n", workers(), *files, *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def loaded_matrix(session: nox.Session) -> Matrix:
    if MATRIX is None:
        session.error(f"the matrix cannot be used: {MATRIX_ERROR}")
    return MATRIX


def refresh_report(session: nox.Session) -> None:
    from gdn.matrix.report import build_report, write_report

    try:
        report = build_report(RESULTS, loaded_matrix(session))
    except FileNotFoundError as exc:  # no cell has run here yet: there is nothing to report
        session.skip(str(exc))
    paths = write_report(report, REPORT)
    session.log("report: " + ", ".join(str(p.relative_to(ROOT)) for p in paths.values()))


def host_cell(cell: Cell):
    def session_fn(session: nox.Session) -> None:
        install_project(session, "test,matrix")
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
        session.skip(f"cell {cell.name} not run{reason}")
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
