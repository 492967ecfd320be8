"""Which package broke it: `gdn-matrix bisect CELL --good LOCK_A --bad LOCK_B` names the package (and
version) between two locks of a cell that flips its failing tests from passing to failing.

    gdn-matrix bisect cpu --good old/cpu.txt --bad locks/cpu.txt [--test NODEID ...] [--work DIR]

Both locks are read strictly (a lock that fails its checks is refused, naming the line and why), and
must be for one platform and Python. The packages that differ (added, removed, version changed) are
the changes; each step is a host-runtime environment made with uv in DIR: the good lock with some of
the bad lock's changes, installed with hashes and without dependencies, this checkout's gdn in it, and
the failing tests run there with pytest under the cell's variables. The tests are the --test node ids,
or those of the cell's selection that fail with the bad lock. The changes are searched by halves, a
group that only installs together changed as one (gdn.matrix.bisect_search). Each step prints which
changes it took from the bad lock, the outcome and the time; DIR/bisect.json holds the result.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from gdn.matrix.bisect_env import BisectInputError, Environments, unhashed
from gdn.matrix.bisect_search import Search, Trial, differences
from gdn.matrix.config import Cell, MatrixConfigError, load_matrix, wheelhouse_dir
from gdn.matrix.lock import LockError, read_lock
from gdn.matrix.lockfile import Lock, LockFileError
from gdn.matrix.program import Program
from gdn.matrix.schema import BisectResult

EXIT_CODES = """exit status:
  0  found the change (or the group of changes) that flips the tests
  1  the bad lock's tests do not fail: nothing to bisect
  2  unusable input: a lock refused, locks for two platforms, the good lock failing too, an end lock
     whose environment does not install here"""
RESULT = "bisect.json"
EXIT = {"found": 0, "no_failure": 1, "good_fails": 2, "unusable": 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cell", help="cell name from matrix.yaml (its variables and test selection)")
    parser.add_argument("--good", type=Path, required=True, metavar="LOCK_A", help="a lock whose tests pass")
    parser.add_argument("--bad", type=Path, required=True, metavar="LOCK_B", help="a lock whose tests fail")
    parser.add_argument(
        "--test",
        action="append",
        default=[],
        metavar="NODEID",
        help="a failing test's pytest node id (repeat it; default: those of the cell's selection that fail "
        "with the bad lock)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the environments and bisect.json go (default: gdn-bisect-CELL in the temporary directory)",
    )
    parser.add_argument("--matrix", type=Path, default=None, help="matrix file (default: $GDN_MATRIX or matrix.yaml)")
    parser.add_argument("--root", type=Path, default=Path(), help="the source checkout (default: .)")


def read_locks(good_path: Path, bad_path: Path) -> tuple[Lock, Lock]:
    """Both locks, read strictly; BisectInputError naming the file and every reason to refuse it."""
    locks = []
    for flag, path in (("--good", good_path), ("--bad", bad_path)):
        try:
            lock = read_lock(path)
        except LockFileError as exc:
            raise BisectInputError(f"{flag} {path} is refused: {exc}") from None
        except LockError as exc:
            raise BisectInputError(f"{flag}: {exc}") from None
        missing = unhashed(lock)
        if missing:
            raise BisectInputError(f"{flag} {path} lists packages without a hash: {', '.join(missing)}")
        locks.append(lock)
    good, bad = locks
    for what in ("platform", "python"):
        if getattr(good, what) != getattr(bad, what):
            raise BisectInputError(
                f"the locks are for two {what}s: --good {getattr(good, what)}, --bad {getattr(bad, what)}"
            )
    return good, bad


def check_tests(tests: list[str]) -> None:
    """A node id that pytest would read as an option is refused."""
    for test in tests:
        if not test or test.startswith("-"):
            raise BisectInputError(f"--test: expected a pytest node id (path::name), got {test!r}")


def cell_variables(cell: Cell) -> dict[str, str]:
    """The variables the cell's tests run under: its compute mode and env, and Triton's interpreter on a
    CPU cell, as a cell without a GPU runs its kernels."""
    env = {"GDN_COMPUTE_MODE": cell.compute_mode, "PYTHONDONTWRITEBYTECODE": "1"}
    if cell.device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    return env | cell.env


def selection(cell: Cell, root: Path, bad: Lock) -> list[str]:
    """The pytest arguments of the cell's test families, as its entry runs them."""
    arguments = [str(root / "tests"), "-m", " or ".join(cell.families)]
    if "pytest-xdist" in bad.packages:
        arguments += ["-n", os.environ.get("GDN_TEST_WORKERS", "auto")]
    return arguments


def run(args: argparse.Namespace) -> int:
    root = args.root.resolve()
    try:
        matrix = load_matrix(args.matrix)
        cell = matrix.cell(args.cell)
        check_tests(args.test)
        good, bad = read_locks(args.good, args.bad)
    except (MatrixConfigError, BisectInputError) as exc:
        print(f"gdn-matrix bisect: {exc}", file=sys.stderr)
        return 2
    work = (args.work or Path(tempfile.gettempdir()) / f"gdn-bisect-{cell.name}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    wheelhouse = wheelhouse_dir(matrix, root)
    environments = Environments(
        root=root,
        work=work,
        locks=(good, bad),
        find_links=(wheelhouse,) if wheelhouse.is_dir() else (),
        env=cell_variables(cell),
        timeout_s=cell.timeout_s,
        tests=tuple(args.test),
    )
    search = Search(good.packages, bad.packages, environments)
    try:
        if not environments.tests:
            failing, trial = _find_failing(environments, cell, root, bad)
            if not failing:
                verdict = "no_failure" if trial.outcome == "pass" else "unusable"
                changes = differences(good.packages, bad.packages)
                return _finish(BisectResult(cell.name, str(args.good), str(args.bad), [], changes, verdict, []), work)
            environments.tests = tuple(failing)
        result = search.run(cell.name, str(args.good), str(args.bad), environments.tests)
    except BisectInputError as exc:
        print(f"gdn-matrix bisect: {exc}", file=sys.stderr)
        return 2
    return _finish(result, work)


def _find_failing(environments: Environments, cell: Cell, root: Path, bad: Lock) -> tuple[list[str], Trial]:
    """The node ids of the cell's selection that fail with the bad lock, and that run's verdict."""
    print(f"no --test: running cell {cell.name}'s tests ({', '.join(cell.families)}) with the bad lock")
    failing, trial = environments.failing_tests(bad.packages, selection(cell, root, bad))
    print(f"the bad lock's tests: {trial.outcome}" + (f" ({trial.detail})" if trial.detail else ""))
    if failing:
        print("failing: " + ", ".join(failing))
    return failing, trial


def _finish(result: BisectResult, work: Path) -> int:
    path = work / RESULT
    result.write(path)
    said = {
        "found": "flips the tests: "
        + "; ".join(c.describe() for c in result.culprit)
        + (" (a group: these change together)" if len(result.culprit) > 1 else ""),
        "no_failure": "the bad lock's tests do not fail: nothing to bisect",
        "good_fails": "the good lock's tests fail too: nothing to bisect between the two",
        "unusable": "an end lock's environment is broken here (see the line above)",
    }[result.verdict]
    print(f"{said}\n{len(result.steps)} steps in {result.duration_s:.0f} s; {path}")
    return EXIT[result.verdict]


PROGRAM = Program(
    "gdn-matrix bisect",
    __doc__.splitlines()[0],
    add_arguments,
    run,
    epilog=EXIT_CODES,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
main = PROGRAM.main

if __name__ == "__main__":
    sys.exit(main())
