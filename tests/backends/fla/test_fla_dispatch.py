"""The manifest's fla section reads fla's own dispatch: which backend its chunk op takes, whether its
Hopper guard blocks the gated backward, whether fla imports at all, and the versions beside it.

fla's registry needs fla, and FlashQLA needs a Hopper/Blackwell GPU, so each state is driven by the
labelled STAND-INS under tests/peer_standins (fla 0.6.0's registry rules on a simulated H200 with
Triton 3.6), each put on sys.path of a subprocess that collects the section.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest

from repo_paths import SRC, TESTS

pytestmark = pytest.mark.probe

STANDINS = TESTS / "peer_standins"
PEERS = ("flash-qla", "tilelang", "z3-solver", "apache-tvm-ffi")
COLLECT = "; ".join(
    [
        "import json",
        "from gdn.backends.fla import fla_section",
        "from gdn.matrix.probe import _fla_text",
        "s = fla_section()",
        "print(json.dumps([s, _fla_text(s)]))",
    ]
)


@functools.cache
def installed_here() -> frozenset[str]:
    """The peer distributions this interpreter has without the stand-ins (a cell image that installs
    flash-qla, tilelang or z3-solver): the stand-ins can add packages to a state but not hide these."""
    code = (
        "import json, importlib.metadata as m\n"
        "have = {(d.metadata['Name'] or '').lower().replace('_', '-') for d in m.distributions()}\n"
        f"print(json.dumps([n for n in {list(PEERS)!r} if n in have]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return frozenset(json.loads(out.stdout))


def needs_absent(*dists: str) -> None:
    """Skip a state that needs a peer package to be absent where this interpreter has the real one."""
    present = sorted(installed_here() & set(dists))
    if present:
        pytest.skip(f"this environment has the real {', '.join(present)}: a state without it cannot be staged here")


def fla_section(*sites: str, **env: str) -> tuple[dict, str]:
    path = os.pathsep.join([*(str(STANDINS / site) for site in sites), str(SRC)])
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")}
    out = subprocess.run(
        [sys.executable, "-c", COLLECT],
        env={**clean, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    section, text = json.loads(out.stdout)
    return section, text


def test_flashqla_installed_takes_flas_chunk_op():
    needs_absent("apache-tvm-ffi")
    section, text = fla_section("fla_registry", "flashqla_site")
    assert section["stand_in"] == "fla 0.6.0 registry (manifest test)"
    assert section["import"]["ok"] is True
    assert section["peer_packages"] == {
        "flash-qla": "0.1.3",
        "tilelang": "0.1.15",
        "z3-solver": "4.15.4.0",
        "apache-tvm-ffi": None,
    }
    assert section["flash_qla_import"] == {"ok": True, "version": "0.1.3"}
    chunk = section["dispatch"]["calls"]["bfloat16"]["chunk"]
    assert chunk["chosen"] == "flash_qla"
    [candidate] = chunk["candidates"]
    assert candidate["backend"] == "flash_qla" and candidate["priority"] == 3
    assert candidate["env_var"] == "FLA_FLASH_QLA" and candidate["default_enable"] is True
    assert candidate["available"] and candidate["enabled"] and candidate["accepted"]
    guard = section["dispatch"]["calls"]["bfloat16"]["hopper_guard"]
    assert guard["applies"] is True and guard["blocks_gated_backward"] is False
    assert "flash_qla" in guard["detail"]
    assert "bfloat16: chunk -> flash_qla" in text and "[stand-in: fla 0.6.0 registry" in text


def test_an_fp32_call_takes_another_kernel_than_a_bf16_one():
    """FlashQLA's verifier refuses fp32: fla's own chunk function runs, and its backward's
    chunk_bwd_dqkwg goes to TileLang (whose verifier takes fp32 where h is in q's dtype). A manifest
    that asked about bf16 only would name FlashQLA for a training step in fp32."""
    needs_absent("apache-tvm-ffi")
    section, text = fla_section("fla_registry", "flashqla_site")
    fp32 = section["dispatch"]["calls"]["float32"]
    assert fp32["chunk"]["chosen"] == "triton"
    [candidate] = fp32["chunk"]["candidates"]
    assert candidate["accepted"] is False and "float16 or bfloat16" in candidate["reason"]
    assert fp32["chunk_bwd_dqkwg"]["chosen"] == "tilelang"
    assert fp32["hopper_guard"]["blocks_gated_backward"] is False
    assert "float32: chunk -> triton, chunk_bwd_dqkwg -> tilelang" in text


def test_fla_flash_qla_0_sends_the_chunk_op_back_to_flas_triton():
    section, text = fla_section("fla_registry", "flashqla_site", FLA_FLASH_QLA="0")
    bf16 = section["dispatch"]["calls"]["bfloat16"]
    assert bf16["chunk"]["chosen"] == "triton"
    [candidate] = bf16["chunk"]["candidates"]
    assert candidate["available"] is True and candidate["enabled"] is False and candidate["accepted"] is None
    assert section["dispatch"]["env"] == {"FLA_FLASH_QLA": "0"}
    # tilelang (with nvcc) takes the gated chunk_bwd_dqkwg, so the guard is not reached
    assert bf16["chunk_bwd_dqkwg"]["chosen"] == "tilelang"
    assert bf16["hopper_guard"]["blocks_gated_backward"] is False
    assert "bfloat16: chunk -> triton, chunk_bwd_dqkwg -> tilelang" in text


def test_fla_alone_on_hopper_is_blocked_by_its_guard():
    needs_absent("flash-qla", "tilelang")
    section, text = fla_section("fla_registry")
    assert section["peer_packages"]["flash-qla"] is None and section["flash_qla_import"] is None
    for dtype in ("bfloat16", "float32"):
        calls = section["dispatch"]["calls"][dtype]
        assert calls["chunk"]["chosen"] == "triton"
        [candidate] = calls["chunk"]["candidates"]
        assert candidate["available"] is False  # flash_qla is not found
        assert calls["chunk_bwd_dqkwg"]["chosen"] == "triton"
        assert calls["hopper_guard"]["blocks_gated_backward"] is True
    assert "float32: chunk -> triton, chunk_bwd_dqkwg -> triton (Hopper guard blocks the gated backward)" in text


def test_tilelang_without_z3_breaks_import_fla_and_says_why():
    needs_absent("z3-solver")
    section, text = fla_section("fla_registry", "tilelang_no_z3")
    assert section["import"] == {
        "ok": False,
        "error": "OSError: libz3.so: cannot open shared object file: No such file or directory",
    }
    assert section["distribution"] == {"name": "fla-core", "version": "0.6.0"}
    assert section["peer_packages"]["tilelang"] == "0.1.15" and section["peer_packages"]["z3-solver"] is None
    assert "dispatch" not in section
    assert "import failed: OSError: libz3.so" in text
