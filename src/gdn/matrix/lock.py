"""Per-cell lock files: every package of a cell's image, with hashes, for the cell's platform and Python.

`gdn-matrix lock [CELL ...]` resolves each cell's pins (matrix.yaml `versions`) and the test tools
(docker/requirements-test.txt) with uv for the cell's platform and writes locks/<cell>.txt, which the
image installs with `pip install --require-hashes --no-deps`. `gdn-matrix lock --check [CELL ...]`
proves that every pin exists for its platform and that each committed lock is whole and still fits
its cell: every line of the format (gdn.matrix.lockfile), the body's digest, the cell's pins and
inputs, and each package's hashes among the files of that release on the index (or the wheelhouse
file's). It does not fail merely because the index has newer versions (that is what `lock` is for).
Exit status: 0 ok, 1 a check or resolution failed, 2 unusable input.

The body of a lock is uv's resolution, then one hashed line per wheelhouse file whose hash is recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict

from gdn.matrix import devices
from gdn.matrix.config import (
    DISTRIBUTIONS,
    Cell,
    Matrix,
    MatrixConfigError,
    load_matrix,
    lock_path,
    wheelhouse_dir,
)
from gdn.matrix.jsonio import UnreadableFileError, read_capped
from gdn.matrix.lockfile import (
    NOT_RECORDED,
    Lock,
    LockFileError,
    file_sha256,
    parse_body,
    parse_lock,
    render_header,
)
from gdn.matrix.program import Program

TEST_REQUIREMENTS = Path("docker/requirements-test.txt")
# Pins a cell takes over what its other packages' metadata allows: a cuda cell pairs torch with a
# Triton other than the one torch pins (cuda-triton39 runs the index's latest over torch 2.13).
OVERRIDE_KEYS = ("triton",)
# Without it uv fetches a CPython from GitHub for the target Python, which a CI machine may not reach.
UV_ENV = {"UV_PYTHON_DOWNLOADS": "never", "NO_COLOR": "1"}
INPUT_NAME = "cell.in"
# The largest lock is about 100 kB.
LOCK_MAX_BYTES = 4 << 20


class LockError(Exception):
    """Input the lock cannot be made or checked from (exit status 2): uv missing or failing for
    another reason than an unsatisfiable pin, a wheel file the resolution needs but cannot find, a lock
    file that cannot be read at all."""


class ResolutionError(Exception):
    """The cell's pins cannot be resolved for its platform (exit status 1); the message is uv's."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Pin(_Frozen):
    key: str
    distribution: str
    version: str
    # the wheel file it comes from, for pins taken from the wheelhouse
    wheel: str | None = None
    # True: the file is installed as is (on no index); False: resolved with its dependencies
    wheelhouse_only: bool = False

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


class LockInputs(_Frozen):
    """Everything a cell's lock is made from; its digest is recorded in the lock's header."""

    cell: str
    platform: str
    python: str
    pins: tuple[Pin, ...]
    test_requirements: tuple[str, ...]

    @property
    def resolved_pins(self) -> tuple[Pin, ...]:
        return tuple(pin for pin in self.pins if not pin.wheelhouse_only)

    @property
    def wheelhouse_pins(self) -> tuple[Pin, ...]:
        return tuple(pin for pin in self.pins if pin.wheelhouse_only)

    @property
    def find_links_wheels(self) -> tuple[str, ...]:
        return tuple(pin.wheel for pin in self.resolved_pins if pin.wheel)

    def requirements(self) -> list[str]:
        """What uv resolves: a pin from a wheelhouse file names that file's exact version (+cpu)."""
        exact = [
            f"{pin.distribution}=={parse_wheel_filename(pin.wheel)[1]}" if pin.wheel else pin.requirement
            for pin in self.resolved_pins
        ]
        return exact + list(self.test_requirements)

    def overrides(self) -> list[str]:
        return [pin.requirement for pin in self.resolved_pins if pin.key in OVERRIDE_KEYS]

    @property
    def digest(self) -> str:
        lines = [f"platform {self.platform}", f"python {self.python}"]
        lines += [f"requirement {r}" for r in self.requirements()]
        lines += [f"override {r}" for r in self.overrides()]
        lines += [f"wheelhouse {pin.wheel}" for pin in self.wheelhouse_pins]
        return "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()


# ---------------------------------------------------------------- inputs


def platform_of(cell: Cell) -> str:
    return devices.kind(cell.device).lock_platform


def read_test_requirements(root: Path) -> tuple[str, ...]:
    path = root / TEST_REQUIREMENTS
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise LockError(f"cannot read the test tools' pins {path}: {exc}") from None
    return tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))


def lock_inputs(cell: Cell, root: Path) -> LockInputs:
    if not cell.locked:
        raise LockError(f"cell {cell.name!r} pins no package: it has no lock")
    if not cell.versions.python:
        raise LockError(f"cell {cell.name!r}: versions.python is required to lock its packages")
    wheels = {key: wheel for wheel, key in cell.wheel_keys().items()}
    pins = tuple(
        Pin(
            key=key,
            distribution=DISTRIBUTIONS[key],
            version=version,
            wheel=wheels.get(key),
            wheelhouse_only=key in cell.wheelhouse_pins,
        )
        for key, version in cell.versions.packages().items()
    )
    return LockInputs(
        cell=cell.name,
        platform=platform_of(cell),
        python=cell.versions.python,
        pins=pins,
        test_requirements=read_test_requirements(root),
    )


# ---------------------------------------------------------------- uv


def uv_binary() -> str:
    try:
        import uv
    except ImportError:
        raise LockError("uv is not installed: pip install 'gdn-matrix[matrix]' (or pip install uv)") from None
    return uv.find_uv_bin()


def uv_version() -> str:
    run = subprocess.run([uv_binary(), "--version"], capture_output=True, text=True, check=False)
    return run.stdout.split()[1] if run.returncode == 0 and len(run.stdout.split()) > 1 else "unknown"


def _uv_compile(
    requirements: list[str], platform: str, python: str, index_args: Sequence[str], extra: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """`uv pip compile` of `requirements` in a scratch directory, so annotations name no host path."""
    with tempfile.TemporaryDirectory(prefix="gdn-lock-") as scratch:
        (Path(scratch) / INPUT_NAME).write_text("\n".join(requirements) + "\n")
        command = [uv_binary(), "pip", "compile", INPUT_NAME, "--quiet", "--no-header", "--no-config"]
        command += ["--python-platform", platform, "--python-version", python, "--no-build", *index_args, *extra]
        # with paths made absolute by the caller, the scratch directory is the only cwd-relative input
        return subprocess.run(
            command, cwd=scratch, capture_output=True, text=True, check=False, env={**os.environ, **UV_ENV}
        )


def _unsatisfiable(run: subprocess.CompletedProcess[str]) -> bool:
    return "No solution found" in run.stderr


def _uv_reason(stderr: str) -> str:
    """uv's explanation on one line: its `cause:` and `hint:` text without the tree drawing."""
    text = " ".join(line.strip() for line in stderr.splitlines() if line.strip())
    text = re.sub(r"^.*?No solution found when resolving dependencies:?\s*", "", text)
    text = re.sub(r"\s+", " ", text.replace("╰─▶", "")).strip()
    return text.removeprefix("cause: ")


def missing_pins(inputs: LockInputs, index_args: Sequence[str] = ()) -> list[str]:
    """Each resolved pin, alone and without its dependencies, for the cell's platform and Python:
    one message per pin that has no distribution there."""
    pins = inputs.resolved_pins
    if not pins:
        return []
    if _check_pins(inputs, [pin.requirement for pin in pins], index_args) is None:
        return []
    found = []
    for pin in pins:
        reason = _check_pins(inputs, [pin.requirement], index_args)
        if reason is not None:
            found.append(
                f"cell {inputs.cell}: {pin.requirement} has no distribution for {inputs.platform} / "
                f"CPython {inputs.python} ({reason})"
            )
    return found


def _check_pins(inputs: LockInputs, requirements: list[str], index_args: Sequence[str]) -> str | None:
    """None when these requirements exist for the cell's platform, else uv's reason."""
    run = _uv_compile(requirements, inputs.platform, inputs.python, index_args, ["--no-deps"])
    if run.returncode == 0:
        return None
    if _unsatisfiable(run):
        return _uv_reason(run.stderr)
    raise LockError(f"cell {inputs.cell}: uv failed: {_uv_reason(run.stderr) or run.stdout.strip()}")


def _resolve(inputs: LockInputs, wheelhouse: Path, index_args: Sequence[str]) -> str:
    """uv's hashed resolution of the cell's resolved pins and the test tools."""
    with tempfile.TemporaryDirectory(prefix="gdn-lock-links-") as links, tempfile.TemporaryDirectory() as scratch:
        extra = ["--generate-hashes"]
        if inputs.find_links_wheels:
            # only the cell's own wheels: any other file in the wheelhouse could satisfy another pin
            for wheel in inputs.find_links_wheels:
                source = wheelhouse / wheel
                if not source.is_file():
                    raise LockError(
                        f"cell {inputs.cell}: {wheel} is not in the wheelhouse {wheelhouse}; the lock takes it "
                        "from there with its hash (put it there, e.g. `pip download --no-deps -d wheelhouse`)"
                    )
                shutil.copyfile(source, Path(links) / wheel)
            extra += ["--find-links", links]
        overrides = inputs.overrides()
        if overrides:
            override_file = Path(scratch) / "overrides.txt"
            override_file.write_text("\n".join(overrides) + "\n")
            extra += ["--override", str(override_file)]
        run = _uv_compile(inputs.requirements(), inputs.platform, inputs.python, index_args, extra)
    if run.returncode != 0:
        reason = _uv_reason(run.stderr)
        if _unsatisfiable(run):
            raise ResolutionError(f"cell {inputs.cell}: the pins do not resolve for {inputs.platform}: {reason}")
        raise LockError(f"cell {inputs.cell}: uv failed: {reason}")
    return run.stdout


# ---------------------------------------------------------------- writing and reading


def render_lock(inputs: LockInputs, resolution: str, wheelhouse: Path, uv: str) -> str:
    """The lock file's text; a wheelhouse file present now gets its hash recorded."""
    requirements, problems = parse_body(resolution)
    if problems:
        raise LockError(f"cell {inputs.cell}: uv's resolution is not a lock body: {'; '.join(problems[:5])}")
    resolved = {r.name: r.version for r in requirements}
    for pin in inputs.wheelhouse_pins:
        name = canonicalize_name(pin.distribution)
        if name in resolved:
            raise ResolutionError(
                f"cell {inputs.cell}: {pin.distribution} is a wheelhouse pin, yet the index resolution also "
                f"brings {pin.distribution}=={resolved[name]} as a dependency"
            )
    fields = [
        ("cell", inputs.cell),
        ("platform", inputs.platform),
        ("python", inputs.python),
        ("uv", uv),
        ("inputs", inputs.digest),
    ]
    hashed = []
    for pin in inputs.wheelhouse_pins:
        path = wheelhouse / pin.wheel
        if path.is_file():
            sha = file_sha256(path)
            fields.append(("wheelhouse", f"{pin.wheel} sha256:{sha}"))
            hashed.append(f"{pin.requirement} \\\n    --hash=sha256:{sha}\n    # from the wheelhouse: {pin.wheel}")
        else:
            fields.append(("wheelhouse", f"{pin.wheel} {NOT_RECORDED}"))
    body = resolution.rstrip("\n") + "\n" + "".join(line + "\n" for line in hashed)
    return render_header(fields, body, inputs.cell) + body


def read_lock(path: Path) -> Lock:
    """The lock file at `path`: LockError when it cannot be read (exit 2), LockFileError naming every
    line at fault when it is not a whole, untouched lock."""
    try:
        data = read_capped(path, LOCK_MAX_BYTES, follow_symlinks=True)
    except (OSError, UnreadableFileError) as exc:
        raise LockError(f"cannot read the lock {path}: {exc}") from None
    return parse_lock(data)


def lock_summary(matrix: Matrix, cell: Cell, root: Path) -> dict[str, object] | None:
    """The cell's lock as its cell.json and report entry carry it; None for a cell without a readable
    lock (the image build says why when it needs one)."""
    path = lock_path(matrix, cell, root)
    if not cell.locked or not path.is_file():
        return None
    try:
        return read_lock(path).summary()
    except (LockError, LockFileError):
        return None


def lock_cell(matrix: Matrix, cell: Cell, root: Path, index_args: Sequence[str] = ()) -> Path:
    """Resolve the cell and write its lock; returns the lock's path."""
    inputs = lock_inputs(cell, root)
    wheelhouse = wheelhouse_dir(matrix, root)
    text = render_lock(inputs, _resolve(inputs, wheelhouse, index_args), wheelhouse, uv_version())
    path = lock_path(matrix, cell, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------- checking


def _satisfies(locked: str | None, pinned: str) -> bool:
    """`==pinned` as PEP 440 reads it: 2.13.0+cpu satisfies a pin of 2.13.0."""
    if locked is None:
        return False
    try:
        return Requirement(f"x=={pinned}").specifier.contains(Version(locked), prereleases=True)
    except (InvalidRequirement, InvalidVersion):
        return locked == pinned


def stale_lock(cell: Cell, inputs: LockInputs, lock: Lock, shown: Path) -> list[str]:
    """Where the committed lock no longer fits the cell: another platform or Python, a pin it does not
    satisfy, or inputs changed since it was made. Never the index's newer versions."""
    problems = [
        f"cell {cell.name}: {shown} is for {what} {got}, the cell is {want}"
        for what, got, want in (
            ("cell", lock.cell, cell.name),
            ("platform", lock.platform, inputs.platform),
            ("Python", lock.python, inputs.python),
        )
        if got != want
    ]
    pinned = [(pin.distribution, pin.version) for pin in inputs.pins]
    for line in inputs.test_requirements:
        requirement = Requirement(line)
        pinned += [(requirement.name, str(spec.version)) for spec in requirement.specifier if spec.operator == "=="]
    for distribution, version in pinned:
        locked = lock.packages.get(canonicalize_name(distribution))
        if not _satisfies(locked, version):
            has = f"{distribution}=={locked}" if locked else f"no {distribution}"
            problems.append(f"cell {cell.name}: matrix pins {distribution}=={version}, {shown} has {has}")
    if not problems and lock.inputs != inputs.digest:
        problems.append(
            f"cell {cell.name}: the lock's inputs changed since {shown} was made (test tools, overrides or "
            f"wheel files); refresh it with `gdn-matrix lock {cell.name}`"
        )
    return problems


def _find_links_hashes(index_args: Sequence[str]) -> dict[tuple[str, str], set[str]]:
    """{(name, version): sha256s} of the wheels in the --find-links directories: uv lists no hashes of
    such files when it need not read them (--no-deps)."""
    found: dict[tuple[str, str], set[str]] = {}
    directories = [Path(value) for option, value in itertools.pairwise(index_args) if option == "--find-links"]
    for directory in directories:
        for path in directory.glob("*.whl"):
            try:
                name, version, _, _ = parse_wheel_filename(path.name)
            except ValueError:
                continue
            found.setdefault((name, str(version)), set()).add(file_sha256(path))
    return found


def _index_hashes(
    inputs: LockInputs, requirements: list[str], index_args: Sequence[str]
) -> dict[str, tuple[str, set[str]]]:
    """{name: (version, sha256s)} of the files the index (and the --find-links directories) have for each
    `name==version` of `requirements`, for the cell's platform and Python; one they lack is left out."""
    if not requirements:
        return {}
    run = _uv_compile(requirements, inputs.platform, inputs.python, index_args, ["--no-deps", "--generate-hashes"])
    if run.returncode != 0:
        if not _unsatisfiable(run):
            raise LockError(f"cell {inputs.cell}: uv failed: {_uv_reason(run.stderr) or run.stdout.strip()}")
        if len(requirements) == 1:
            return {}
        found = {}
        for requirement in requirements:
            found.update(_index_hashes(inputs, [requirement], index_args))
        return found
    listed, _ = parse_body(run.stdout)  # local files come without hashes: added below
    local = _find_links_hashes(index_args)
    return {r.name: (r.version, set(r.hashes) | local.get((r.name, r.version), set())) for r in listed}


def hash_problems(
    lock: Lock, inputs: LockInputs, wheelhouse: Path, index_args: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """(problems, notes): each hash of the lock must be a file of its package's release, as the index
    lists them for the cell's platform, or the wheelhouse file it was taken from. A new file of a
    release (a wheel uploaded later) fails nothing; a hash of no file of the release does. The notes
    say what could not be verified here (a wheelhouse file that is absent)."""
    problems, notes = [], []
    for pin in inputs.pins:
        name = canonicalize_name(pin.distribution)
        path = wheelhouse / pin.wheel if pin.wheel else None
        listed = lock.hashes.get(name)
        if path is None or not listed:
            continue  # not from the wheelhouse, or its hash not recorded (no image is built so)
        if not path.is_file():
            notes.append(f"{pin.distribution}'s hash not verified here: {pin.wheel} is not in the wheelhouse")
            continue
        sha = file_sha256(path)
        if list(listed) != [sha]:
            problems.append(
                f"line {lock.lines[name]}: {name}=={lock.packages[name]}: its hashes are not the wheelhouse file "
                f"{pin.wheel}'s sha256:{sha[:12]}…"
            )
    from_files = {canonicalize_name(pin.distribution) for pin in inputs.pins if pin.wheel}
    asked = {name: lock.packages[name] for name in lock.hashes if name not in from_files}
    index = _index_hashes(inputs, [f"{name}=={version}" for name, version in asked.items()], index_args)
    for name, version in asked.items():
        found = index.get(name)
        if found is None or Version(found[0]) != Version(version):
            problems.append(
                f"line {lock.lines[name]}: {name}=={version} is not on the index for {inputs.platform} / "
                f"CPython {inputs.python}"
            )
            continue
        problems += [
            f"line {line}: sha256:{digest[:12]}… is no file of {name} {version} on the index"
            for digest, line in lock.hashes[name].items()
            if digest not in found[1]
        ]
    return problems, notes


def check_cell(matrix: Matrix, cell: Cell, root: Path, index_args: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(problems, notes) of the cell's pins and committed lock; see the module's docstring."""
    inputs = lock_inputs(cell, root)
    problems = missing_pins(inputs, index_args)
    path = lock_path(matrix, cell, root)
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    if not path.is_file():
        return [*problems, f"cell {cell.name}: no lock file {shown}; make it with `gdn-matrix lock {cell.name}`"], []
    try:
        lock = read_lock(path)
    except LockFileError as exc:
        problems += [f"cell {cell.name}: {shown} {problem}" for problem in exc.problems]
        if exc.lock is None:
            return problems, []
        lock = exc.lock  # well formed, yet not as made: the index says which lines differ
    problems += stale_lock(cell, inputs, lock, shown)
    found, notes = hash_problems(lock, inputs, wheelhouse_dir(matrix, root), index_args)
    return [*problems, *(f"cell {cell.name}: {shown} {problem}" for problem in found)], notes


# ---------------------------------------------------------------- gdn-matrix lock


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cells", nargs="*", metavar="CELL", help="cells to lock or check (default: every cell)")
    parser.add_argument(
        "--check", action="store_true", help="check pins and committed locks instead of writing new locks"
    )
    parser.add_argument("--matrix", type=Path, default=None, help="matrix file (default: $GDN_MATRIX or matrix.yaml)")
    parser.add_argument("--root", type=Path, default=Path(), help="the source checkout (default: .)")
    parser.add_argument(
        "--find-links", action="append", default=[], type=Path, metavar="DIR", help="also look for wheels in DIR"
    )
    parser.add_argument("--no-index", action="store_true", help="use no package index (only --find-links)")


def _index_args(args: argparse.Namespace) -> list[str]:
    found = ["--no-index"] if args.no_index else []
    for directory in args.find_links:
        found += ["--find-links", str(directory.resolve())]
    return found


def _selected(matrix: Matrix, names: Sequence[str]) -> list[Cell]:
    if names:
        return [matrix.cell(name) for name in names]
    return [cell for cell in matrix.cells if cell.locked]


def run(args: argparse.Namespace) -> int:
    root = args.root.resolve()
    index_args = _index_args(args)
    try:
        matrix = load_matrix(args.matrix)
        cells = _selected(matrix, args.cells)
    except MatrixConfigError as exc:
        print(f"gdn-matrix lock: {exc}", file=sys.stderr)
        return 2
    failed = False
    for cell in cells:
        try:
            if args.check:
                problems, notes = check_cell(matrix, cell, root, index_args)
                for problem in problems:
                    print(problem, file=sys.stderr)
                failed = failed or bool(problems)
                said = "lock check failed" if problems else "ok"
                print(f"cell {cell.name}: {said}" + (f" ({'; '.join(notes)})" if notes else ""))
            else:
                path = lock_cell(matrix, cell, root, index_args)
                print(f"cell {cell.name}: locked {path.relative_to(root) if path.is_relative_to(root) else path}")
        except ResolutionError as exc:
            print(str(exc), file=sys.stderr)
            failed = True
        except (LockError, MatrixConfigError) as exc:
            print(f"gdn-matrix lock: {exc}", file=sys.stderr)
            return 2
    return 1 if failed else 0


PROGRAM = Program("gdn-matrix lock", __doc__.splitlines()[0], add_arguments, run)
main = PROGRAM.main


if __name__ == "__main__":
    sys.exit(main())
