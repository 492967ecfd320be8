"""nox sessions: `tests` and `lint` for the project itself, and `local`, the embedded default matrix
cell (host runtime, no docker, no accelerator): probe the environment, run the test families with
JUnit output, and leave everything under results/local/.

CPU environments install torch through constraints/cpu.txt so that no multi-GB CUDA build of torch
is ever pulled onto a machine without a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CPU_CONSTRAINTS = str(ROOT / "constraints" / "cpu.txt")

nox.options.sessions = ["lint", "tests"]
nox.options.default_venv_backend = "venv"


def install_project(session: nox.Session, extras: str = "test") -> None:
    session.install("-c", CPU_CONSTRAINTS, "-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The project's test suite on CPU (pytest-xdist across the cores)."""
    install_project(session)
    session.run("pytest", "-n", os.environ.get("GDN_TEST_WORKERS", "auto"), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def local(session: nox.Session) -> None:
    """The `local` cell in the current host: probe manifest and resolutions, then the test families."""
    install_project(session)
    out = ROOT / "results" / "local"
    out.mkdir(parents=True, exist_ok=True)
    session.run("python", "-m", "gdn.probe", "--output", str(out / "manifest.json"))
    session.run(
        "pytest",
        "-n",
        os.environ.get("GDN_TEST_WORKERS", "auto"),
        f"--junitxml={out / 'junit.xml'}",
        *session.posargs,
    )
    session.log(f"results in {out}")
