"""The noxfile's sessions as nox runs them: a cell that cannot run here is skipped with its reason,
or fails where GDN_REQUIRE_RUN=1 asks every session to run (CI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import ROOT

pytestmark = pytest.mark.tooling

CUDA_CELL = {
    "name": "cuda-somewhere",
    "device": "cuda",
    "runtime": "docker",
    "dockerfile": "docker/cuda.Dockerfile",
    "base_image": "nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04",
    "versions": {"python": "3.12", "cuda": "13.0"},
}


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The noxfile beside the source it imports and a matrix of one CUDA cell; no GPU (GDN_HOST_ROOT)."""
    pytest.importorskip("nox", reason="nox (the test extra) is not installed")
    shutil.copyfile(ROOT / "noxfile.py", tmp_path / "noxfile.py")
    (tmp_path / "src").symlink_to(ROOT / "src")
    (tmp_path / "matrix.yaml").write_text(json.dumps({"schema": 1, "cells": [CUDA_CELL]}))
    (tmp_path / "no-gpu").mkdir()
    return tmp_path


def nox(checkout: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("GDN_MATRIX", "GDN_REQUIRE_RUN")}
    environment.update(GDN_HOST_ROOT=str(checkout / "no-gpu"), **env)
    command = [sys.executable, "-m", "nox", "-f", str(checkout / "noxfile.py"), *args]
    return subprocess.run(command, cwd=checkout, env=environment, capture_output=True, text=True, timeout=300)


def test_a_cell_that_cannot_run_is_skipped_with_its_reason_or_fails_when_a_run_is_required(checkout):
    skipped = nox(checkout, "-s", "cuda-somewhere")
    assert skipped.returncode == 0, skipped.stderr
    assert "Session cuda-somewhere skipped: cell cuda-somewhere not run: /dev/nvidiactl is absent" in skipped.stderr
    required = nox(checkout, "-s", "cuda-somewhere", GDN_REQUIRE_RUN="1")
    assert required.returncode == 1, required.stderr
    assert "GDN_REQUIRE_RUN=1: a session that cannot run here fails" in required.stderr
    status = json.loads((checkout / "results" / "cuda-somewhere" / "cell.json").read_text())["status"]
    assert status == "not_run"
