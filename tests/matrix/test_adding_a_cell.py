"""docs/design.md's "Adding a cell", done: a copy of matrix.yaml with one new cell, and nothing else
written. The cell validates with the others, nox lists its session (by its name, tagged with its device
kind and runtime), the CI job matrix carries it, its lock's place and inputs follow from it (its lock is
not resolved here: that needs the package index), and `gdn-matrix run` takes it: in the host runtime,
on a machine without its device, it is recorded as not run, with the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gdn.matrix import ci
from gdn.matrix.cli import main as gdn_matrix
from gdn.matrix.config import load_matrix, lock_path
from gdn.matrix.lock import lock_inputs
from repo_paths import ROOT

pytestmark = pytest.mark.tooling

NAME = "cuda-torch213"
# the whole of the change: one entry, appended to the cells (the last key of matrix.yaml)
NEW_CELL = f"""
  - name: {NAME}
    description: torch 2.13 with the Triton it pins (3.7.1) on CUDA 13.0, fla 0.6.0.
    device: cuda
    runtime: docker
    dockerfile: docker/cuda.Dockerfile
    base_image: nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
    versions: {{python: "3.12", cuda: "13.0", torch: "2.13.0", triton: "3.7.1", fla: "0.6.0", transformers: "5.17.0"}}
    runner_labels: [self-hosted, linux, x64, gpu]
    families: [probe, single_op]
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The repository's noxfile, source, image recipes and locks beside a matrix.yaml that is the
    repository's plus the new cell; a host root without a GPU (GDN_HOST_ROOT)."""
    (tmp_path / "src").symlink_to(ROOT / "src")
    for name in ("docker", "locks"):  # copied: the matrix keeps its paths inside the checkout
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copyfile(ROOT / "noxfile.py", tmp_path / "noxfile.py")
    (tmp_path / "matrix.yaml").write_text((ROOT / "matrix.yaml").read_text().rstrip("\n") + "\n" + NEW_CELL)
    (tmp_path / "no-gpu").mkdir()
    return tmp_path


def test_the_new_cell_joins_the_matrix_with_every_cell_before_it(checkout):
    before = [cell.name for cell in load_matrix(ROOT / "matrix.yaml").cells]
    after = load_matrix(checkout / "matrix.yaml")
    assert [cell.name for cell in after.cells] == [*before, NAME]
    cell = after.cell(NAME)
    assert (cell.device, cell.runtime, cell.families) == ("cuda", "docker", ("probe", "single_op"))


def test_nox_lists_the_cells_session_by_its_name_and_tags(checkout):
    pytest.importorskip("nox", reason="nox (the test extra) is not installed")
    environment = {k: v for k, v in os.environ.items() if k not in ("GDN_MATRIX", "GDN_REQUIRE_RUN")}

    def listed(*args: str) -> str:
        command = [sys.executable, "-m", "nox", "-f", str(checkout / "noxfile.py"), "-l", *args]
        done = subprocess.run(command, cwd=checkout, env=environment, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    # `-`: not one of the sessions nox runs by default; `*`: selected (here by its tag)
    assert f"- {NAME} [cuda,docker] -> matrix cell (cuda, docker): torch 2.13 with the Triton it pins" in listed()
    assert f"* {NAME} [cuda,docker] ->" in listed("-t", "cuda")
    assert f"* {NAME} [cuda,docker] ->" in listed("-t", "docker")
    assert f"- {NAME} [cuda,docker] ->" in listed("-t", "npu")


def test_the_ci_job_matrix_carries_the_cell(checkout, tmp_path):
    output = tmp_path / "github-output"
    assert ci.main(["--matrix", str(checkout / "matrix.yaml"), "--github-output", str(output)]) == 0
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    [job] = [job for job in json.loads(outputs["self_hosted"])["include"] if job["cell"] == NAME]
    assert job == {
        "cell": NAME,
        "device": "cuda",
        "runtime": "docker",
        "runs_on": ["self-hosted", "linux", "x64", "gpu"],
        "local_base": False,
        "torch": "2.13.0",
        "timeout_minutes": job["timeout_minutes"],
    }
    assert NAME not in outputs["hosted"]


def test_the_cells_lock_is_named_after_it_and_made_from_its_pins(checkout):
    matrix = load_matrix(checkout / "matrix.yaml")
    cell = matrix.cell(NAME)
    path = lock_path(matrix, cell, checkout)
    assert path == checkout / "locks" / f"{NAME}.txt" and not path.exists()  # `gdn-matrix lock cuda-torch213`
    inputs = lock_inputs(cell, checkout)
    assert (inputs.platform, inputs.python) == ("x86_64-manylinux_2_28", "3.12")
    pinned = ["torch==2.13.0", "triton==3.7.1", "fla-core==0.6.0", "transformers==5.17.0"]
    assert inputs.requirements()[: len(pinned)] == pinned
    assert inputs.overrides() == ["triton==3.7.1"]  # a Triton the cell pins wins over torch's own pin


def test_gdn_matrix_run_takes_the_cell_and_records_it_not_run_without_a_gpu(checkout, monkeypatch):
    monkeypatch.setenv("GDN_HOST_ROOT", str(checkout / "no-gpu"))
    monkeypatch.delenv("GDN_REQUIRE_RUN", raising=False)
    results = checkout / "results"
    common = ["--matrix", str(checkout / "matrix.yaml"), "--results", str(results), "--root", str(checkout)]
    assert gdn_matrix(["run", NAME, "--runtime", "host", *common]) == 0
    outcome = json.loads((results / NAME / "cell.json").read_text())
    assert (outcome["status"], outcome["runtime"], outcome["matrix_runtime"]) == ("not_run", "host", "docker")
    assert (
        outcome["reason"] == "/dev/nvidiactl is absent on this machine: cuda cells need an NVIDIA GPU (/dev/nvidiactl)"
    )
