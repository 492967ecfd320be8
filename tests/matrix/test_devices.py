"""The device-kind table drives config, the cell runner, images and the report: the shipped kinds, and a
new kind (ROCm) added as one entry and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from gdn.matrix import devices, report_build, report_parts
from gdn.matrix.cell import run_cell
from gdn.matrix.config import MatrixConfigError, parse_matrix
from gdn.matrix.jsonio import write_json
from gdn.matrix.schema import CellOutcome
from gdn.op_names import OP_NAMES
from report_models import typed_cell

pytestmark = pytest.mark.tooling


def test_the_shipped_kinds():
    assert list(devices.KINDS) == ["cpu", "cuda", "npu"]
    assert all(name == kind.name for name, kind in devices.KINDS.items())
    cpu, cuda, npu = (devices.KINDS[name] for name in ("cpu", "cuda", "npu"))
    assert (cpu.host_marker, cpu.needs, cpu.accelerator) == (None, None, False)
    assert (cuda.torch_type, cuda.host_marker, cuda.needs) == (
        "cuda",
        Path("/dev/nvidiactl"),
        "an NVIDIA GPU (/dev/nvidiactl)",
    )
    assert (npu.torch_type, npu.host_marker, npu.needs) == (
        "npu",
        Path("/dev/davinci_manager"),
        "an Ascend NPU runner (/dev/davinci_manager)",
    )
    assert [k.lock_platform for k in (cpu, cuda, npu)] == [
        "x86_64-manylinux_2_28",
        "x86_64-manylinux_2_28",
        "aarch64-manylinux_2_28",
    ]
    assert "self-hosted" in cuda.runner_labels and "self-hosted" in npu.runner_labels
    assert "self-hosted" not in cpu.runner_labels


def test_needs_text_is_the_device_and_the_engine():
    assert devices.needs_text("npu", "docker") == (
        "needs an Ascend NPU runner (/dev/davinci_manager) and a docker engine"
    )
    assert devices.needs_text("cuda", "host") == "needs an NVIDIA GPU (/dev/nvidiactl)"
    assert devices.needs_text("cpu", "docker") == "needs a docker engine"
    assert devices.needs_text("cpu", "host") == "needs only a Python environment with gdn installed"


def test_marker_decides_presence_under_the_host_root(tmp_path, monkeypatch):
    cuda = devices.kind("cuda")
    assert cuda.absent_reason(tmp_path) == (
        "/dev/nvidiactl is absent on this machine: cuda cells need an NVIDIA GPU (/dev/nvidiactl)"
    )
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()
    assert cuda.absent_reason(tmp_path) is None
    monkeypatch.setenv(devices.HOST_ROOT_ENV, str(tmp_path))
    assert cuda.absent_reason() is None
    assert devices.kind("cpu").absent_reason(tmp_path / "nowhere") is None
    with pytest.raises(ValueError, match=r"unknown device kind 'tpu'; expected one of \['cpu', 'cuda', 'npu'\]"):
        devices.kind("tpu")


def test_a_cell_without_runner_labels_gets_its_kinds_and_an_empty_list_stays_empty():
    matrix = parse_matrix(
        {
            "schema": 1,
            "cells": [
                {"name": "a", "device": "npu", "runtime": "host"},
                {"name": "b", "device": "npu", "runtime": "host", "runner_labels": []},
                {"name": "c", "device": "npu", "runtime": "host", "runner_labels": ["mine"]},
            ],
        }
    )
    assert [c.runner_labels for c in matrix.cells] == [devices.KINDS["npu"].runner_labels, (), ("mine",)]


# ---------------------------------------------------------------- a new kind is one entry

ROCM = devices.DeviceKind(
    name="rocm",
    torch_type="cuda",  # ROCm builds of torch serve the cuda device type
    host_marker=Path("/dev/kfd"),
    container=lambda root: devices.ContainerAccess(
        devices=(f"{root}/dev/kfd:/dev/kfd:rwm", f"{root}/dev/dri:/dev/dri:rwm"), group_add=("video",)
    ),
    runner_labels=("self-hosted", "rocm"),
    lock_platform="x86_64-manylinux_2_28",
    needs="an AMD GPU (/dev/kfd)",
)
ROCM_CELL = {
    "name": "rocm-x",
    "device": "rocm",
    "runtime": "docker",
    "dockerfile": "docker/rocm.Dockerfile",
    "base_image": "rocm/dev:7",
    "expect": [{"op": "chunk_gated_delta_rule", "backend": "triton"}],
}


@pytest.fixture
def with_rocm(monkeypatch):
    monkeypatch.setitem(devices.KINDS, "rocm", ROCM)


def test_without_the_entry_the_kind_is_refused():
    with pytest.raises(MatrixConfigError, match=r"cell 'rocm-x': key 'device'.*unknown device kind 'rocm'"):
        parse_matrix({"schema": 1, "cells": [ROCM_CELL]})


def test_one_entry_makes_a_kind_known_to_config_runner_and_report(with_rocm, tmp_path):
    matrix = parse_matrix({"schema": 1, "cells": [ROCM_CELL, {**ROCM_CELL, "name": "rocm-never"}]})
    cell = matrix.cells[0]
    assert cell.runner_labels == ("self-hosted", "rocm")

    # the runner: the marker decides
    results = tmp_path / "results"
    got = run_cell(matrix, cell, tmp_path, results, echo=lambda line: None, host_root=tmp_path / "bare")
    assert (got.status, got.reason) == (
        "not_run",
        "/dev/kfd is absent on this machine: rocm cells need an AMD GPU (/dev/kfd)",
    )

    # the report: resolutions and cards are read on the kind's torch device type
    CellOutcome(cell="rocm-x", status="passed", device="rocm", runtime="docker", real_hardware=True).write(
        results / "rocm-x"
    )
    records = [
        {"op": op, "device": device, "backend": "eager", "route": "eager", "rejected": []}
        for op in OP_NAMES
        for device in ("cpu", "cuda")
    ]
    write_json(results / "rocm-x" / "resolution.json", records)
    write_json(results / "rocm-x" / "manifest.json", {"devices": {"cuda": {"devices": [{"name": "AMD MI300X"}]}}})
    built = report_build.build_report(results, matrix).to_json()
    ran, never = built["cells"]
    assert report_parts.cell_primary_device(typed_cell(ran)) == "cuda" and not report_parts.accelerator_missing(
        typed_cell(ran)
    )
    assert report_parts.card_text(typed_cell(ran)) == "AMD MI300X"
    assert ran["expectations"][0]["ok"] is False  # resolved eager on the device, triton expected
    assert never["reason"] == "no results: never run; needs an AMD GPU (/dev/kfd) and a docker engine"
    assert never["expectations"][0]["ok"] is None


def test_one_entry_gives_the_container_its_devices(with_rocm, tmp_path):
    pytest.importorskip("docker", reason="the docker SDK (the matrix extra) is not installed")
    from gdn.matrix import images

    cell = parse_matrix({"schema": 1, "cells": [ROCM_CELL]}).cells[0]
    options = images.container_options(cell, host_root=tmp_path)
    assert options["devices"] == [f"{tmp_path}/dev/kfd:/dev/kfd:rwm", f"{tmp_path}/dev/dri:/dev/dri:rwm"]
    groups = ["video", str(images.results_gid())]
    assert (options["group_add"], options["device_requests"], options["volumes"]) == (groups, [], {})
