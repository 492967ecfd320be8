"""The environments of `gdn-matrix bisect`: a set of packages taken from two locks becomes a hashed
requirements file, a uv virtual environment with this checkout's gdn in it, and a pytest run there.

Each requirement line is written from the parsed locks (`name==version \\` and its
`--hash=sha256:` lines) and read back through the lock's own body parser before uv sees it: nothing a
lock says becomes a pip option. uv installs the file with `--require-hashes --no-deps` (the file is
the whole environment). Whether those packages hold together is `uv pip check`'s word: an unmet
requirement makes the step broken and names the two packages, which the search then changes
together. Then gdn's wheel, built once per search, goes in without its dependencies (they are the
lock's to bring). Every step installs from uv's one cache
(its default, or $UV_CACHE_DIR), so a package's wheel (torch's CPU build above all) is downloaded and
unpacked once and linked into each later environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from gdn.matrix import outcomes
from gdn.matrix.bisect_search import Trial
from gdn.matrix.lock import UV_ENV, uv_binary
from gdn.matrix.lockfile import Lock, parse_body

# uv pip check: "The package `transformers` requires `huggingface-hub>=1.3,<2`, but `0.36.0` is installed"
_UNMET = re.compile(r"The package `([^`]+)` requires `([^`]+)`")
# what a test run must not inherit: the caller's own environment; its PYTHONPATH is kept (CANN's
# set_env.sh puts the toolkit's Python packages there on an Ascend host) less this checkout's entries
_INHERITED = ("VIRTUAL_ENV", "PYTHONHOME")
REASON_CHARS = 300


class BisectInputError(ValueError):
    """Locks or tests that no environment can be made from (the command's exit status 2)."""


def requirements_text(packages: Mapping[str, str], locks: Sequence[Lock]) -> str:
    """A hashed requirements file of `packages` (name -> version), each line taken from the first of
    `locks` that lists the package at that version with its hashes."""
    lines = []
    for name, version in sorted(packages.items()):
        lock = next((lock for lock in locks if lock.packages.get(name) == version and lock.hashes.get(name)), None)
        if lock is None:
            raise BisectInputError(f"{name}=={version}: no lock lists it with a hash, so it cannot be installed")
        hashes = sorted(lock.hashes[name])
        lines.append(f"{name}=={version} \\")
        lines += [
            f"    --hash=sha256:{digest}" + (" \\" if i < len(hashes) - 1 else "") for i, digest in enumerate(hashes)
        ]
    text = "\n".join(lines) + "\n"
    _, problems = parse_body(text)
    if problems:  # a lock's own parser accepted each part; a whole that it refuses is a defect here
        raise BisectInputError(f"the composed requirements are not a lock body: {'; '.join(problems[:3])}")
    return text


def unhashed(lock: Lock) -> list[str]:
    """The packages of `lock` that carry no hash (a wheelhouse file absent when it was locked)."""
    return sorted(f"{name}=={version}" for name, version in lock.packages.items() if not lock.hashes.get(name))


def unmet_requirements(check_output: str) -> list[tuple[str, str]]:
    """(requirer, required) canonical names of each unmet requirement `uv pip check` reports."""
    found = []
    for requirer, requirement in _UNMET.findall(check_output):
        try:
            required = Requirement(requirement).name
        except InvalidRequirement:
            continue
        found.append((canonicalize_name(requirer), canonicalize_name(required)))
    return found


def _reason(run: subprocess.CompletedProcess[str]) -> str:
    text = " ".join(line.strip() for line in (run.stderr + "\n" + run.stdout).splitlines() if line.strip())
    return text[-REASON_CHARS:]


@dataclass
class Environments:
    """Builds and tests the environments of one search under `work`. `find_links` are the wheelhouse
    directories (torch+cpu's file); `env` the cell's variables for the test run; `timeout_s` each test
    run's limit."""

    root: Path
    work: Path
    locks: tuple[Lock, ...]
    find_links: tuple[Path, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 3600.0
    tests: tuple[str, ...] = ()
    _built: dict[frozenset[tuple[str, str]], Path | Trial] = field(default_factory=dict)
    _wheel: Path | None = None

    def _uv(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [uv_binary(), *arguments],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **UV_ENV},
        )

    def gdn_wheel(self) -> Path:
        """This checkout's gdn as a wheel, built once: every environment installs the same file. It is
        built from a copy of what the build reads (pyproject.toml, the readme it names, src/): setuptools
        puts into a wheel whatever its build/ directory still holds, so a module removed since an earlier
        build of the checkout would come back, and the build writes nothing into the checkout."""
        if self._wheel is None:
            out, source = self.work / "gdn-wheel", self.work / "gdn-source"
            for directory in (out, source):
                shutil.rmtree(directory, ignore_errors=True)
            source.mkdir(parents=True)
            for name in ("pyproject.toml", "README.md"):
                shutil.copy2(self.root / name, source / name)
            shutil.copytree(
                self.root / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
            run = self._uv("build", "--wheel", "--no-config", "--out-dir", str(out), str(source))
            wheels = sorted(out.glob("*.whl"))
            if run.returncode != 0 or not wheels:
                raise BisectInputError(f"cannot build this checkout's gdn wheel: {_reason(run)}")
            self._wheel = wheels[0]
        return self._wheel

    def build(self, packages: Mapping[str, str]) -> Path | Trial:
        """The environment's Python, or a broken Trial saying why it is not usable."""
        key = frozenset(packages.items())
        if key not in self._built:
            self._built[key] = self._build(packages, self.work / f"env-{len(self._built) + 1:02d}")
        return self._built[key]

    def _build(self, packages: Mapping[str, str], directory: Path) -> Path | Trial:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        requirements = directory / "requirements.txt"
        requirements.write_text(requirements_text(packages, self.locks))
        venv = directory / "venv"
        python_version = self.locks[0].python
        run = self._uv("venv", "--quiet", "--no-config", "--python", python_version, str(venv))
        if run.returncode != 0:
            raise BisectInputError(f"uv cannot make a Python {python_version} environment here: {_reason(run)}")
        python = venv / "bin" / "python"
        links = [argument for path in self.find_links for argument in ("--find-links", str(path))]
        install = ["pip", "install", "--quiet", "--no-config", "--python", str(python), "--no-deps"]
        run = self._uv(*install, "--require-hashes", *links, "-r", str(requirements))
        if run.returncode != 0:
            return Trial("broken", f"uv could not install the packages: {_reason(run)}")
        run = self._uv("pip", "check", "--no-config", "--python", str(python))
        if run.returncode != 0:
            unmet = unmet_requirements(run.stdout + run.stderr)
            listed = "; ".join(f"{a} needs {b}" for a, b in unmet) or _reason(run)
            return Trial("broken", f"the packages do not hold together: {listed}", tuple(unmet))
        # after the check, which judges the locks' packages: gdn comes without its dependencies, which
        # are the lock's to bring
        run = self._uv(*install, str(self.gdn_wheel()))
        if run.returncode != 0:
            return Trial("broken", f"uv could not install gdn: {_reason(run)}")
        return python

    def pytest(self, python: Path, arguments: Sequence[str]) -> subprocess.CompletedProcess[str] | None:
        """pytest in the environment from the checkout's root (the node ids' root); None past the limit."""
        env = {k: v for k, v in os.environ.items() if k not in _INHERITED} | dict(self.env)
        search_path = outside(env.pop("PYTHONPATH", ""), self.root)
        if search_path:
            env["PYTHONPATH"] = search_path
        command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", *arguments]
        try:
            return subprocess.run(
                command, cwd=self.root, capture_output=True, text=True, check=False, env=env, timeout=self.timeout_s
            )
        except subprocess.TimeoutExpired:
            return None

    def __call__(self, packages: Mapping[str, str]) -> Trial:
        """The search's trial: the failing tests' verdict in the environment of `packages`."""
        built = self.build(packages)
        if isinstance(built, Trial):
            return built
        return self._verdict(self.pytest(built, ["--", *self.tests]))

    def failing_tests(self, packages: Mapping[str, str], selection: Sequence[str]) -> tuple[list[str], Trial]:
        """The node ids that fail or error when `selection` (pytest arguments: the cell's test files and
        markers) runs in the environment of `packages`, and that run's verdict."""
        built = self.build(packages)
        if isinstance(built, Trial):
            return [], built
        record = self.work / "selection" / outcomes.FILE
        record.parent.mkdir(parents=True, exist_ok=True)
        record.unlink(missing_ok=True)
        run = self.pytest(built, ["-p", "gdn.matrix.outcomes", f"{outcomes.OPTION}={record}", *selection])
        finished = outcomes.read_finished(record)
        failing = [test.nodeid for test in finished if test.outcome in ("failed", "error")]
        return failing, self._verdict(run)

    def _verdict(self, run: subprocess.CompletedProcess[str] | None) -> Trial:
        """A pytest run's verdict: its exit status 0 passes, 1 fails; anything else (a usage error, no
        test collected, past the time limit) gives none."""
        if run is None:
            return Trial("broken", f"the tests ran past {self.timeout_s:.0f} s")
        if run.returncode in (0, 1):
            return Trial("pass" if run.returncode == 0 else "fail", _summary(run.stdout))
        return Trial("broken", f"pytest exited {run.returncode}: {_reason(run)}")


def outside(search_path: str, root: Path) -> str:
    """`search_path` (PYTHONPATH) without the entries in the checkout at `root`: the gdn a step tests is
    the one installed in its environment."""
    kept = [
        entry for entry in search_path.split(os.pathsep) if entry and not Path(entry).resolve().is_relative_to(root)
    ]
    return os.pathsep.join(kept)


def _summary(stdout: str) -> str:
    """pytest's closing line (`1 failed, 2 passed in 3.4s`)."""
    lines = [line.strip("= ").strip() for line in stdout.splitlines() if line.strip()]
    return lines[-1] if lines else ""
