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
from repo_paths import ROOT

pytestmark = pytest.mark.tooling

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
    from gdn.backends.registry import names

    assert list(names()) == list(resolve.backends())
    assert parse_matrix(mutated("cpu", compute_mode="triton")).cell("cpu").compute_mode == "triton"


def test_a_site_label_for_an_accelerator_cell_is_its_own_business():
    cell = parse_matrix(mutated("npu-266", runner_labels=["ascend-lab-7"])).cell("npu-266")
    assert cell.runner_labels == ("ascend-lab-7",)


def test_unhashable_values_are_config_errors_not_crashes():
    with pytest.raises(MatrixConfigError, match=r"cell 'cpu': key 'device'"):
        parse_matrix(mutated("cpu", device=["cpu"]))


SHIPPED_TEXT = (ROOT / "matrix.yaml").read_text()


def write_matrix_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def test_a_duplicate_key_is_refused_with_both_lines(tmp_path):
    """yaml keeps the last of two equal keys: `device: cpu` then `device: cuda` made a cuda cell, and a
    second `cells: []` dropped every cell."""
    first = "    device: cpu\n    runtime: docker\n    dockerfile: docker/cpu.Dockerfile"
    assert first in SHIPPED_TEXT
    text = SHIPPED_TEXT.replace(first, first.replace("    runtime:", "    device: cuda\n    runtime:"), 1)
    at = line_of(SHIPPED_TEXT, first)
    with pytest.raises(MatrixConfigError, match=rf"line {at + 1}: duplicate key 'device' \(first at line {at}\)"):
        load_matrix(write_matrix_text(tmp_path / "m.yaml", text))
    text = SHIPPED_TEXT + "cells: []\n"
    first_cells = line_of(text, "\ncells:") + 1
    last = text.count("\n")
    with pytest.raises(MatrixConfigError, match=rf"line {last}: duplicate key 'cells' \(first at line {first_cells}\)"):
        load_matrix(write_matrix_text(tmp_path / "m.yaml", text))


@pytest.mark.parametrize(
    ("key", "value"),
    [("timeout_s", True), ("timeout_s", 60.0), ("bench", "yes"), ("privileged", 1), ("limits", {"pids": "8192"})],
)
def test_a_value_of_another_type_is_refused_not_converted(key, value):
    """`timeout_s: true` became a 1-second timeout, `bench: "yes"` a benchmark run."""
    with pytest.raises(MatrixConfigError, match=rf"cell 'cpu': key '{key}(\.pids)?': Input should be a valid"):
        parse_matrix(mutated("cpu", **{key: value}))


@pytest.mark.parametrize(
    "name",
    ["A=B", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "DYLD_INSERT_LIBRARIES", "GCONV_PATH",
     "PATH", "BASH_ENV", "lower", "1ABC", "", "A B"],
)  # fmt: skip
def test_an_env_name_that_is_no_plain_variable_or_steers_a_loader_is_refused(name):
    with pytest.raises(MatrixConfigError, match=r"cell 'cpu': key 'env': .*environment variable"):
        parse_matrix(mutated("cpu", env={name: "x"}))


def test_plain_env_names_are_accepted_and_values_carry_no_nul():
    cell = parse_matrix(mutated("cpu", env={"GDN_TEST_WORKERS": "2", "_X1": "a=b"})).cell("cpu")
    assert cell.env == {"GDN_TEST_WORKERS": "2", "_X1": "a=b"}
    with pytest.raises(MatrixConfigError, match=r"cell 'cpu': key 'env': .*NUL"):
        parse_matrix(mutated("cpu", env={"A": "x\0y"}))


@pytest.mark.parametrize("key", ["wheelhouse", "locks"])
@pytest.mark.parametrize("value", [".git", ".git/hooks", "./.git", "sub/.GIT/x"])
def test_top_level_directories_never_lie_in_git(key, value):
    raw = copy.deepcopy(SHIPPED)
    raw[key] = value
    with pytest.raises(MatrixConfigError, match=rf"key '{key}': .*\.git"):
        parse_matrix(raw)


def test_a_locks_or_wheelhouse_directory_that_leads_out_of_the_checkout_is_refused(tmp_path, monkeypatch):
    from gdn.matrix.config import lock_path, wheelhouse_dir

    root, outside = tmp_path / "checkout", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "locks").symlink_to(outside)
    (root / "wheelhouse").symlink_to(outside)
    monkeypatch.delenv("GDN_WHEELHOUSE", raising=False)
    matrix = load_matrix(ROOT / "matrix.yaml")
    with pytest.raises(MatrixConfigError, match=r"key 'locks': .* leads to .*elsewhere, outside "):
        lock_path(matrix, matrix.cell("cpu"), root)
    with pytest.raises(MatrixConfigError, match=r"key 'wheelhouse': .* leads to .*elsewhere, outside "):
        wheelhouse_dir(matrix, root)
    monkeypatch.setenv("GDN_WHEELHOUSE", str(outside))  # the operator's own choice
    assert wheelhouse_dir(matrix, root) == outside


BROKEN_FILES = {
    "invalid-utf8": ("schema: 1\ncells:\n  - name: caf\xe9\n".encode("latin-1"), r"line 3: not valid UTF-8"),
    "utf16": (SHIPPED_TEXT.encode("utf-16"), r"line 1: not valid UTF-8"),
    "nested": (b"schema: 1\ncells: " + b"[" * 20_000 + b"]" * 20_000 + b"\n", r"line 2: nested deeper than"),
    "alias": (b"schema: 1\nx: &a [1]\ncells: *a\n", r"line 2: anchors and aliases"),
    "duplicate": (b"schema: 1\nschema: 1\ncells: []\n", r"line 2: duplicate key 'schema' \(first at line 1\)"),
}


@pytest.mark.parametrize("broken", BROKEN_FILES, ids=list(BROKEN_FILES))
def test_a_matrix_file_that_cannot_load_is_a_config_error(tmp_path, broken):
    content, message = BROKEN_FILES[broken]
    path = tmp_path / "m.yaml"
    path.write_bytes(content)
    with pytest.raises(MatrixConfigError, match=message):
        load_matrix(path)


def test_a_matrix_path_that_is_no_regular_file_is_a_config_error(tmp_path):
    with pytest.raises(MatrixConfigError, match="cannot read the matrix"):
        load_matrix(tmp_path)
    with pytest.raises(MatrixConfigError, match="not a regular file"):
        load_matrix(Path("/dev/zero"))
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (2 << 20))
    with pytest.raises(MatrixConfigError, match="larger than"):
        load_matrix(big)


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


@pytest.mark.parametrize("broken", ["injection", *BROKEN_FILES])
def test_a_broken_matrix_leaves_nox_usable_and_says_what_is_wrong(nox_copy: Path, broken: str):
    if broken != "injection":
        (nox_copy / "broken.yaml").write_bytes(BROKEN_FILES[broken][0])
    said = "cell 'cpu': key 'versions.python'" if broken == "injection" else BROKEN_FILES[broken][1]
    listed = nox(nox_copy, "-l")
    assert listed.returncode == 0, listed.stderr
    assert re.search(said, listed.stderr), listed.stderr
    assert "Traceback" not in listed.stderr
    sessions = set(re.findall(r"^[*-] (\w[\w-]*)", listed.stdout, re.MULTILINE))
    assert {"tests", "lint", "kernels", "matrix", "report", "lock", "diff"} <= sessions
    assert "cpu" not in sessions and "local" not in sessions
    stand_in = nox(nox_copy, "-s", "matrix")
    assert stand_in.returncode == 1
    assert "Session matrix aborted: the matrix cannot be used" in stand_in.stderr
    assert re.search(said, stand_in.stderr.split("Session matrix aborted")[1])
