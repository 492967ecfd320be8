"""The environment manifest and the `gdn-matrix manifest` command: every section present, missing and broken
packages reported as findings (never a crash), CANN versions read from a fake tree, fla_npu's API
generation told apart on stand-in packages."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import gdn.matrix.probe as gdn_manifest
from gdn import compute_mode
from gdn.backends.ascendc import surface
from gdn.backends.triton.findings import NO_DRIVER, triton_section
from gdn.matrix import cli
from gdn.op_names import OP_NAMES
from standins import harness

pytestmark = pytest.mark.probe

SECTIONS = {
    "schema",
    "generated_at",
    "hostname",
    "python",
    "torch",
    "triton",
    "torch_npu",
    "cann",
    "fla_npu",
    "ascendc",
    "fla",
    "transformers",
    "devices",
    "gdn",
    "checks",
    "resolution",
}
VERDICTS = {"ok", "warn", "fail", "n/a"}
# variables that would change what the probe sees; each test sets the ones it means to
PROBE_ENV = (
    "GDN_COMPUTE_MODE",
    "GDN_STRICT",
    "GDN_NPU_FUSED_FWD",
    "GDN_ASCEND_ROOT",
    "ASCEND_HOME_PATH",
    "ASCEND_OPP_PATH",
    "TRITON_INTERPRET",
)

real_ascend_stack = pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is None or importlib.util.find_spec("fla_npu") is None,
    reason="asserts an NPU cell's findings (the real torch_npu and fla_npu wheels)",
)
no_accelerator_stack = pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None or torch.cuda.is_available(),
    reason="asserts the CPU-only machine's findings (no torch_npu, no CUDA)",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROBE_ENV:
        monkeypatch.delenv(name, raising=False)


# On a GPU machine with an empty Triton cache the probe compiles every op's kernels for its numeric
# probes, while the other test workers compile theirs: the H200 took over 60 s there (12-20 s warm).
PROBE_TIMEOUT_S = 300


def run_probe(*args: str, pythonpath: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    # one intra-op thread: the probe's tensors are tiny, and spin-waiting threads crawl on a busy machine
    child_env = {k: v for k, v in os.environ.items() if k not in PROBE_ENV} | {"OMP_NUM_THREADS": "1"} | env
    if pythonpath is not None:
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "gdn.manifest", *args],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
    )


def probe_json(*args: str, pythonpath: Path | None = None, **env: str) -> dict[str, Any]:
    done = run_probe("--json", *args, pythonpath=pythonpath, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return probe_json()


def test_json_has_every_section(manifest: dict[str, Any]) -> None:
    assert set(manifest) == SECTIONS
    assert manifest["schema"] == 1
    assert manifest["python"]["version"] == platform.python_version()
    assert manifest["torch"]["version"] == torch.__version__
    assert manifest["gdn"]["compute_mode"] == "auto"
    assert "eager" in manifest["gdn"]["backends"]


@no_accelerator_stack
def test_missing_torch_npu_and_cuda_are_reported(manifest: dict[str, Any]) -> None:
    assert manifest["torch_npu"] == {
        "distribution": None,
        "import": {"ok": False, "error": "ModuleNotFoundError: No module named 'torch_npu'"},
    }
    assert manifest["devices"]["cuda"] == {"available": False, "count": 0, "devices": []}
    assert manifest["devices"]["npu"] == {"count": 0, "devices": []}
    assert {r["device"] for r in manifest["resolution"]} == {"cpu"}


def test_every_op_resolves_to_eager_on_cpu(manifest: dict[str, Any]) -> None:
    cpu = {r["op"]: r for r in manifest["resolution"] if r["device"] == "cpu"}
    assert set(cpu) == set(OP_NAMES)
    for op, record in cpu.items():
        assert (record["backend"], record["route"], record["requested_mode"]) == ("eager", "eager", "auto"), op


def write_cann_tree(root: Path, toolkit: str | None, driver: str | None) -> None:
    """A stand-in for an Ascend install: only the two version files the probe reads."""
    if toolkit is not None:
        info = root / "ascend-toolkit" / "latest" / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
        info.parent.mkdir(parents=True)
        info.write_text(f"package_name=Ascend-cann-toolkit\nversion={toolkit}\narch={platform.machine()}\n")
    if driver is not None:
        info = root / "driver" / "version.info"
        info.parent.mkdir(parents=True)
        info.write_text(f"Version={driver}\nascendhal_version=7.35.19\n")


def test_fake_cann_tree_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_cann_tree(tmp_path, toolkit="8.5.0", driver="25.2.0")
    monkeypatch.setenv("GDN_ASCEND_ROOT", str(tmp_path))
    cann = gdn_manifest.cann_section()
    assert cann["present"] is True
    assert cann["root"] == str(tmp_path)
    assert cann["toolkit"]["version"] == "8.5.0"
    assert cann["driver"]["version"] == "25.2.0"


def test_ascend_home_path_names_the_toolkit_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_cann_tree(tmp_path / "default", toolkit="8.3.RC1", driver=None)
    write_cann_tree(tmp_path / "sourced", toolkit="9.1.0", driver=None)
    monkeypatch.setenv("GDN_ASCEND_ROOT", str(tmp_path / "default"))
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path / "sourced" / "ascend-toolkit" / "latest"))
    assert gdn_manifest.cann_section()["toolkit"]["version"] == "9.1.0"


def test_absent_cann_is_reported_with_the_paths_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GDN_ASCEND_ROOT", str(tmp_path))
    cann = gdn_manifest.cann_section()
    assert cann["present"] is False
    assert cann["toolkit"]["present"] is False
    assert str(tmp_path / "ascend-toolkit") in cann["toolkit"]["reason"]
    assert cann["driver"] == {"present": False, "reason": f"not found: {tmp_path / 'driver' / 'version.info'}"}


def test_invalid_env_mode_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("GDN_COMPUTE_MODE", "bogus")
    assert gdn_manifest.main(["--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["gdn"]["compute_mode"] is None
    assert manifest["gdn"]["compute_mode_error"].startswith("ValueError: environment variable GDN_COMPUTE_MODE")
    assert "'bogus'" in manifest["gdn"]["compute_mode_error"]
    assert len(manifest["resolution"]) >= len(OP_NAMES)
    assert all("'bogus'" in r["error"] for r in manifest["resolution"])


def test_invalid_mode_flag_exits_2(capsys: pytest.CaptureFixture) -> None:
    assert gdn_manifest.main(["--json", "--mode", "bogus"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "'bogus'" in err


def test_mode_flag_resolves_with_that_mode_and_does_not_outlive_the_call(capsys: pytest.CaptureFixture) -> None:
    assert gdn_manifest.main(["--json", "--mode", "eager"]) == 0
    records = json.loads(capsys.readouterr().out)["resolution"]
    assert {r["requested_mode"] for r in records} == {"eager"}
    assert compute_mode() == "auto"


def test_broken_fla_npu_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "fla_npu"
    package.mkdir()
    # stand-in for fla_npu imported without CANN's set_env.sh: the real one raises from its ctypes load
    (package / "__init__.py").write_text('raise OSError("set_env.sh not sourced")\n')
    fla_npu = probe_json(pythonpath=tmp_path)["fla_npu"]
    assert fla_npu["import"] == {"ok": False, "error": "OSError: set_env.sh not sourced"}
    assert "api" not in fla_npu


def write_stable_fla_npu(root: Path) -> None:
    """A stand-in for a fla_npu 26.10 wheel without the embedded legacy extension, NOT the real
    package: the loader exists but fails, and the stable module carries the composite forward."""
    package = root / "fla_npu"
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text(
        '"""Test stand-in for fla_npu 26.10."""\n'
        '__gdn_stand_in__ = "fla_npu 26.10 (probe test)"\n'
        "def load_legacy_torch_ops():\n"
        '    raise FileNotFoundError("stand-in: no embedded legacy extension")\n'
        "def is_legacy_torch_ops_loaded():\n"
        "    return False\n"
    )
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "ascendc.py").write_text(
        '"""Test stand-in for fla_npu.ops.ascendc."""\n'
        "def npu_chunk_gated_delta_rule_fwd(*args, **kwargs):\n"
        '    raise NotImplementedError("stand-in")\n'
    )
    dist_info = root / "flash_linear_attention_npu-26.10.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: flash-linear-attention-npu\nVersion: 26.10.0\n")


def test_stable_fla_npu_stand_in_is_generation_26_10(tmp_path: Path) -> None:
    write_stable_fla_npu(tmp_path)
    fla_npu = probe_json(pythonpath=tmp_path)["fla_npu"]
    assert fla_npu["distribution"] == {"name": "flash-linear-attention-npu", "version": "26.10.0"}
    assert fla_npu["import"]["ok"] is True
    assert fla_npu["stand_in"] == "fla_npu 26.10 (probe test)"
    assert fla_npu["api"] == {
        "load_legacy_torch_ops": True,
        "legacy_torch_ops_loaded": False,
        "stable_module": {"ok": True, "version": None},
        "composite_fwd": True,
        "legacy_ops_registered": False,
        "generation": "26.10-stable",
    }


def test_legacy_fla_npu_stand_in_is_generation_26_6(tmp_path: Path) -> None:
    package = tmp_path / "fla_npu"
    package.mkdir()
    # stand-in for fla_npu 26.6, NOT the real package: it registers a torch.ops.npu op on import, has no
    # load_legacy_torch_ops, and prints to stdout the way some wheels do while loading
    (package / "__init__.py").write_text(
        "import torch\n"
        'torch.library.define("npu::npu_chunk_gated_delta_rule_fwd_h", "(Tensor x) -> Tensor")\n'
        'print("stand-in fla_npu loaded")\n'
    )
    api = probe_json(pythonpath=tmp_path)["fla_npu"]["api"]
    assert api["load_legacy_torch_ops"] is False
    assert api["legacy_ops_registered"] is True
    assert api["stable_module"]["ok"] is False
    assert api["generation"] == "26.6-legacy"


@pytest.mark.parametrize(
    ("has_loader", "stable_api", "legacy_registered", "generation"),
    [
        (True, True, False, "26.10-stable"),
        (False, False, True, "26.6-legacy"),
        (False, True, True, "26.6-legacy"),
        (True, False, False, "unknown"),
        (False, True, False, "unknown"),
    ],
)
def test_fla_npu_generation(has_loader: bool, stable_api: bool, legacy_registered: bool, generation: str) -> None:
    assert surface.generation(has_loader, stable_api, legacy_registered) == generation


def test_summary_and_output_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    output = tmp_path / "cell" / "manifest.json"
    assert gdn_manifest.main(["--output", str(output)]) == 0
    summary = capsys.readouterr().out
    written = json.loads(output.read_text())
    assert set(written) == SECTIONS
    assert f"torch         {torch.__version__}" in summary
    for op in OP_NAMES:
        assert any(line.split() == [op, "cpu", "->", "eager"] for line in summary.splitlines()), op
    for check in written["checks"]:
        assert f"{check['verdict']:<5} {check['name']}: {check['detail']}" in summary


# ---------------------------------------------------------------- wheel-compat checks


def verdicts(manifest: dict[str, Any]) -> dict[str, str]:
    checks = manifest["checks"]
    assert [c["name"] for c in checks] == list(dict.fromkeys(c["name"] for c in checks)), "duplicate check"
    assert {c["verdict"] for c in checks} <= VERDICTS
    return {c["name"]: c["verdict"] for c in checks}


@no_accelerator_stack
def test_a_machine_without_an_ascend_stack_has_nothing_to_check(manifest: dict[str, Any]) -> None:
    no_torch_npu = "torch_npu is not importable: ModuleNotFoundError: No module named 'torch_npu'"
    assert manifest["ascendc"] == {"reason": no_torch_npu}
    assert verdicts(manifest) == {
        "cann_toolkit": "n/a",
        "npu_driver": "n/a",
        "cann_env": "n/a",
        "torch_npu": "n/a",
        "npu_devices": "n/a",
        "triton_ascend": "n/a",
        "fla_npu": "n/a",
        "fla_npu_api": "n/a",
        "ascendc": "n/a",
    }


def test_missing_cann_is_reported_with_the_exact_errors(tmp_path: Path) -> None:
    # the stand-ins (tests/standins) fail as the real packages do without CANN: torch_npu cannot
    # load libhccl.so, fla_npu refuses to import before set_env.sh
    env = harness.environment(tmp_path, "26.10", cann=False, GDN_STAND_IN_TORCH_NPU="missing-cann")
    manifest = harness.run_json(env, "gdn.manifest")
    assert manifest["torch_npu"]["import"]["error"].startswith(
        "ImportError: libhccl.so: cannot open shared object file: No such file or directory."
    )
    assert manifest["fla_npu"]["import"]["error"] == (
        "RuntimeError: CANN environment is not initialized. Please source the CANN set_env.sh before importing fla_npu."
    )
    details = {c["name"]: c["detail"] for c in manifest["checks"]}
    found = verdicts(manifest)
    # an Ascend stack is expected now, so triton-ascend is judged (ok where a cell installs it)
    assert found.pop("triton_ascend") in ("ok", "warn")
    assert found == {
        "cann_toolkit": "fail",
        "npu_driver": "fail",
        "cann_env": "fail",
        "torch_npu": "fail",
        "npu_devices": "n/a",
        "fla_npu": "fail",
        "fla_npu_api": "n/a",
        "ascendc": "n/a",
    }
    assert details["torch_npu"].endswith(
        "(CANN's libraries are not on the loader path: install CANN and source its set_env.sh)"
    )
    assert details["fla_npu"].endswith("(source CANN's set_env.sh before importing fla_npu)")
    assert details["cann_env"] == "set_env.sh not sourced: ASCEND_HOME_PATH and ASCEND_OPP_PATH unset"


def with_npu(manifest: dict[str, Any], **triton: str) -> dict[str, Any]:
    """The local manifest as a cell with a working torch_npu and two NPUs would show it."""
    m = copy.deepcopy(manifest)
    m["torch_npu"] = {
        "distribution": {"name": "torch_npu", "version": "2.9.0.post3"},
        "import": {"ok": True, "version": "2.9.0.post3"},
        "devices": ["Ascend910B3", "Ascend910B3"],
        "device_count": 2,
    }
    m["triton"]["distributions"] = triton
    m["triton"]["flavour"] = "+".join(triton)
    return m


@pytest.mark.parametrize(
    ("triton", "verdict", "detail"),
    [
        ({"triton-ascend": "3.2.1"}, "ok", "3.2.1"),
        ({}, "warn", "not installed: the triton backend cannot target the NPU"),
        (
            {"triton": "3.2.0", "triton-ascend": "3.2.1"},
            "warn",
            "both triton and triton-ascend installed (triton+triton-ascend): the last wins",
        ),
    ],
)
def test_triton_ascend_check(manifest: dict[str, Any], triton: dict, verdict: str, detail: str) -> None:
    checks = {c["name"]: c for c in gdn_manifest.checks_section(with_npu(manifest, **triton))}
    assert (checks["triton_ascend"]["verdict"], checks["triton_ascend"]["detail"]) == (verdict, detail)
    assert checks["npu_devices"] == {"name": "npu_devices", "verdict": "ok", "detail": "2 x Ascend910B3"}
    assert checks["torch_npu"] == {"name": "torch_npu", "verdict": "ok", "detail": "torch_npu 2.9.0.post3"}
    # an Ascend stack without CANN is broken, not merely absent
    assert checks["cann_toolkit"]["verdict"] == "fail"


@real_ascend_stack
def test_the_installed_ascend_stack_passes_its_checks(manifest: dict[str, Any]) -> None:
    failed = [c for c in manifest["checks"] if c["verdict"] == "fail"]
    assert failed == []
    assert "stand_in" not in manifest["fla_npu"] and "stand_in" not in manifest["torch_npu"]


@real_ascend_stack
def test_the_installed_fla_npu_serves_the_training_ops_on_its_generation_route(manifest: dict[str, Any]) -> None:
    plan = manifest["ascendc"]
    assert "reason" not in plan, plan["reason"]
    generation = plan["surface"]["generation"]
    routes = {
        "26.6-legacy": {"ascendc:legacy-torch-ops"},
        "26.10-stable": {"ascendc:stable-api", "ascendc:composite-fwd"},
    }[generation]
    assert plan["routes"]["chunk_gated_delta_rule"]["route"] in routes
    on_npu = {r["op"]: r for r in manifest["resolution"] if r["device"] == "npu"}
    chunk = on_npu["chunk_gated_delta_rule"]
    assert (chunk["backend"], chunk["route"]) == ("ascendc", plan["routes"]["chunk_gated_delta_rule"]["route"])
    assert chunk["probe"]["passed"] is True


def test_gdn_matrix_probe_json(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["manifest", "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert set(manifest) == SECTIONS
    assert {r["op"] for r in manifest["resolution"]} == set(OP_NAMES)


def test_gdn_matrix_requires_a_subcommand(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([])
    assert exited.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_a_library_printing_on_import_leaves_the_childs_result_intact(tmp_path: Path) -> None:
    # TileLang prints to stdout at import when it cannot query torch.npu; a cell that installs it beside
    # the stand-ins must still read each child's result
    noisy = tmp_path / "noisy"
    noisy.mkdir()
    (noisy / "sitecustomize.py").write_text("print('a library announces itself on stdout')\n")
    env = harness.environment(tmp_path / "child", "26.10")
    env["PYTHONPATH"] = os.pathsep.join([str(noisy), env["PYTHONPATH"]])
    manifest = harness.run_json(env, "gdn.manifest")
    assert manifest["fla_npu"]["import"]["ok"] is True


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU driver")
def test_a_machine_without_a_gpu_says_no_gpu_driver():
    """Triton's own words there are "0 active drivers ([]). There should only be one.", which reads as
    a breakage; the manifest says what it means."""
    section = triton_section()
    assert section["active_backend"] is None
    assert section["active_backend_error"] == NO_DRIVER
    assert section["active_backend_error"].startswith("no GPU driver")
