"""matrix.yaml schema: the shipped matrix loads, and every malformed one names the cell and key."""

from __future__ import annotations

import copy

import pytest
import yaml

from gdn.matrix.config import MatrixConfigError, cell_files, load_matrix, parse_matrix
from gdn.op_names import OP_NAMES
from repo_paths import ROOT

pytestmark = pytest.mark.tooling

SHIPPED = yaml.safe_load((ROOT / "matrix.yaml").read_text())


def test_shipped_matrix_has_the_required_cells():
    matrix = load_matrix(ROOT / "matrix.yaml")
    cells = {c.name: c for c in matrix.cells}
    assert {"local", "cpu", "npu-266", "npu-2610"} <= set(cells)
    assert cells["local"].runtime == "host" and cells["local"].device == "cpu"
    # the main job: the bundled kernels must serve every op the probe resolves, its tests in auto
    assert (cells["local"].probe_mode, cells["local"].compute_mode) == ("triton", "auto")
    assert {(e.op, e.backend) for e in cells["local"].expect} == {(op, "triton") for op in OP_NAMES}
    assert cells["cpu"].runtime == "docker" and cells["cpu"].device == "cpu"
    cuda = [c for c in matrix.cells if c.device == "cuda"]
    assert len({c.versions.triton for c in cuda}) >= 2, "two CUDA cells with different Triton"
    assert cells["npu-266"].versions.fla_npu.startswith("26.6")
    assert cells["npu-2610"].versions.fla_npu.startswith("26.10")
    for name in ("npu-266", "npu-2610"):
        assert cells[name].versions.cann and cells[name].versions.torch_npu and cells[name].versions.triton_ascend
        assert cells[name].wheels, "fla_npu wheels are files, not on an index"


def test_build_args_describe_the_base_image_and_packages_come_from_the_lock():
    cell = load_matrix(ROOT / "matrix.yaml").cell("npu-2610")
    expected = {"BASE_IMAGE": cell.base_image, "PYTHON_VERSION": cell.versions.python, "CANN_VERSION": "9.1.0"}
    assert cell.build_args == expected


def mutated(edit) -> dict:
    raw = copy.deepcopy(SHIPPED)
    edit(raw)
    return raw


def cell_named(raw: dict, name: str) -> dict:
    return next(c for c in raw["cells"] if c["name"] == name)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda r: cell_named(r, "npu-2610")["versions"].update(fla_npuu="26.10.0"),
            r"cell 'npu-2610': key 'versions.fla_npuu': unknown key",
        ),
        (lambda r: cell_named(r, "cpu").update(colour="red"), r"cell 'cpu': key 'colour': unknown key"),
        (lambda r: r["cells"].append(copy.deepcopy(cell_named(r, "cpu"))), r"duplicate cell name 'cpu'"),
        (lambda r: cell_named(r, "npu-266").pop("device"), r"cell 'npu-266': key 'device': missing field"),
        (lambda r: cell_named(r, "cpu").pop("dockerfile"), r"cell 'cpu'.*dockerfile: required when runtime is docker"),
        (lambda r: cell_named(r, "cpu").update(device="tpu"), r"cell 'cpu': key 'device'"),
        (lambda r: cell_named(r, "cpu").update(families=["probe", "fuzz"]), r"cell 'cpu': key 'families.1'"),
        (
            lambda r: cell_named(r, "local").update(expect=[{"op": "chunk", "backend": "eager"}]),
            r"cell 'local': key 'expect.0.op'.*unknown op 'chunk'",
        ),
        (lambda r: cell_named(r, "cpu").update(timeout_s=0), r"cell 'cpu': key 'timeout_s'"),
        (lambda r: cell_named(r, "cpu").update(name="CPU cell"), r"cell 'CPU cell': key 'name'"),
        (lambda r: r.pop("schema"), r"key 'schema': missing field"),
        (lambda r: r.update(extra=1), r"key 'extra': unknown key"),
        (
            lambda r: cell_named(r, "npu-266").update(wheelhouse_pins=["fla_npu", "torch_npu"]),
            r"cell 'npu-266'.*wheelhouse_pins: 'torch_npu' has no wheel file in `wheels`",
        ),
        (
            lambda r: cell_named(r, "npu-266").update(wheelhouse_pins=["cann"]),
            r"cell 'npu-266'.*wheelhouse_pins: 'cann' is not a package version this cell pins",
        ),
        (
            lambda r: cell_named(r, "npu-266")["versions"].update(fla_npu="26.6.1"),
            r"cell 'npu-266'.*wheels: 'flash_linear_attention_npu-26.6.0-.*' is .*, the cell pins fla_npu 26.6.1",
        ),
        (
            lambda r: cell_named(r, "cpu").update(wheels=["numpy-2.0.0-py3-none-any.whl"]),
            r"cell 'cpu'.*wheels: 'numpy-2.0.0-py3-none-any.whl' is numpy 2.0.0, which the cell's versions do not pin",
        ),
        (
            lambda r: cell_named(r, "cpu").update(wheels=["torch.zip"]),
            r"cell 'cpu'.*wheels: 'torch.zip' is not a wheel file name",
        ),
    ],
)
def test_malformed_matrix_names_cell_and_key(edit, message):
    with pytest.raises(MatrixConfigError, match=message):
        parse_matrix(mutated(edit))


def test_not_a_mapping_and_bad_yaml(tmp_path):
    with pytest.raises(MatrixConfigError, match="expected a mapping"):
        parse_matrix(["cells"])
    bad = tmp_path / "m.yaml"
    bad.write_text("cells: [\n")
    with pytest.raises(MatrixConfigError, match="not valid YAML"):
        load_matrix(bad)
    with pytest.raises(MatrixConfigError, match="cannot read"):
        load_matrix(tmp_path / "missing.yaml")


def test_missing_wheel_names_cell_and_key(tmp_path, monkeypatch):
    matrix = load_matrix(ROOT / "matrix.yaml")
    monkeypatch.setenv("GDN_WHEELHOUSE", str(tmp_path))
    with pytest.raises(MatrixConfigError, match=r"cell 'npu-266': key 'wheels\[0\]': file .* does not exist"):
        cell_files(matrix, matrix.cell("npu-266"), ROOT)
    wheel = tmp_path / matrix.cell("npu-266").wheels[0]
    wheel.write_bytes(b"stand-in wheel bytes")
    files = cell_files(matrix, matrix.cell("npu-266"), ROOT)
    assert files["wheels[0]"] == wheel and files["dockerfile"].is_file()


def test_unknown_cell_lists_the_cells():
    with pytest.raises(MatrixConfigError, match=r"no cell named 'gpu'; cells: \['local'"):
        load_matrix(ROOT / "matrix.yaml").cell("gpu")
