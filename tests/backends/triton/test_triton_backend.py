"""The `triton` backend as the resolver sees it: where it is offered, why it is rejected (no
interpreter on the host, no Triton, a Triton that targets another device), its route, and a passing
probe under the interpreter in a fresh process (Triton reads TRITON_INTERPRET when kernels are
decorated, so that case cannot share this process)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import gdn
import gdn.backends.triton as triton_backend
import gdn.resolve as resolver
from gdn.backends.triton._common import Flavour
from gdn.op_names import OP_NAMES

pytestmark = pytest.mark.probe

HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    monkeypatch.delenv(resolver.MODE_ENV, raising=False)
    monkeypatch.delenv(resolver.STRICT_ENV, raising=False)
    gdn.set_compute_mode(None)
    resolver.reset()
    original = resolver.backends()["triton"]
    yield
    gdn.register_backend(original, replace=True)
    gdn.set_compute_mode(None)
    resolver.reset()


def fresh_backend():
    """A new instance, so that no earlier test's load (or failed load) is cached in it."""
    backend = triton_backend.TritonBackend()
    gdn.register_backend(backend, replace=True)
    return backend


def l2norm_record():
    [record] = [r for r in gdn.resolutions() if r["op"] == "l2norm"]
    return record


@pytest.mark.parametrize("interpret", [None, "1"])
def test_registered_first_on_cuda_second_on_npu_never_on_cpu(monkeypatch, interpret):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    backends = resolver.backends()
    triton = backends["triton"]
    assert triton.devices == ("cpu", "cuda", "npu")
    assert triton.auto_rank == {"cuda": 0, "npu": 1}
    assert triton.auto_rank["cuda"] < backends["fla"].auto_rank["cuda"]
    # auto on the host never tries it, not even with the interpreter on
    gdn.l2norm(torch.randn(4, 8))
    record = l2norm_record()
    assert record["backend"] == "eager" and record["rejected"] == []


@pytest.mark.parametrize("strict", [False, True])
def test_host_without_interpreter_is_rejected_with_the_reason(monkeypatch, strict):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fresh_backend()
    gdn.set_compute_mode("triton")
    x = torch.randn(3, 16)
    if strict:
        monkeypatch.setenv(resolver.STRICT_ENV, "1")
        with pytest.raises(gdn.GdnBackendError, match=r"TRITON_INTERPRET=1 \(the interpreter\)"):
            gdn.l2norm(x)
        return
    torch.testing.assert_close(gdn.l2norm(x), x / x.norm(dim=-1, keepdim=True), rtol=1e-5, atol=1e-6)
    record = l2norm_record()
    assert record["backend"] == "eager"
    [rejection] = record["rejected"]
    assert rejection["backend"] == "triton"
    assert rejection["reason"] == "triton on cpu needs TRITON_INTERPRET=1 (the interpreter)"
    assert rejection["probe"] is None


def test_missing_triton_is_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now fails as if not installed
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    backend = fresh_backend()
    reason = backend.why_unavailable("cuda")  # the device check already needs triton
    assert reason.startswith("ModuleNotFoundError") and "triton" in reason

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    backend = fresh_backend()
    gdn.set_compute_mode("triton")
    gdn.l2norm(torch.randn(3, 16))
    [rejection] = l2norm_record()["rejected"]
    assert rejection["reason"].startswith("ModuleNotFoundError") and "triton" in rejection["reason"]


@pytest.mark.parametrize(
    ("installed", "device", "reason"),
    [
        (Flavour("triton", "3.6.0", "cuda"), "cuda", None),
        (Flavour("triton", "3.6.0", "hip"), "cuda", None),
        (Flavour("triton", "3.6.0", "cuda"), "npu", "triton 3.6.0 (target cuda) does not target npu"),
        (Flavour("triton-ascend", "3.2.0", "npu"), "npu", None),
        (Flavour("triton-ascend", "3.2.0", "npu"), "cuda", "triton-ascend 3.2.0 (target npu) does not target cuda"),
    ],
)
def test_the_active_triton_target_must_match_the_device(monkeypatch, installed, device, reason):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_backend, "flavour", lambda: installed)
    assert triton_backend.TritonBackend().check(device) == reason


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_route_names_the_interpreter(monkeypatch):
    backend = triton_backend.TritonBackend()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backend.route_of("l2norm") == "triton:bundled(interpreter)"
    assert triton_backend.flavour().target is None
    monkeypatch.delenv("TRITON_INTERPRET")
    assert backend.route_of("l2norm") == "triton:bundled"


RESOLVE_UNDER_INTERPRETER = textwrap.dedent(
    """
    import json
    import torch
    import gdn
    from gdn.resolve import backends

    x = torch.randn(5, 33, 100, requires_grad=True)
    y = gdn.l2norm(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    ref = x.detach().clone().requires_grad_(True)
    ref_y = ref * torch.rsqrt((ref * ref).sum(-1, keepdim=True) + 1e-6)
    ref_y.backward(dy)
    print(json.dumps({
        "resolutions": gdn.resolutions(),
        "y_err": ((y - ref_y).norm() / ref_y.norm()).item(),
        "dx_err": ((x.grad - ref.grad).norm() / ref.grad.norm()).item(),
        "ops": sorted(backends()["triton"].ops),
    }))
    """
)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_interpreter_resolves_l2norm_to_the_bundled_kernels():
    env = {**os.environ, "TRITON_INTERPRET": "1", resolver.MODE_ENV: "triton", resolver.STRICT_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE_UNDER_INTERPRETER], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    [record] = result["resolutions"]
    assert record["backend"] == "triton"
    assert record["route"] == "triton:bundled(interpreter)"
    assert record["rejected"] == []
    assert record["probe"]["passed"] is True
    assert record["probe"]["tolerance"] == 1e-5
    assert record["probe"]["max_rel_err"] < 1e-5
    assert result["y_err"] < 1e-5 and result["dx_err"] < 1e-5
    assert set(result["ops"]) == set(OP_NAMES), "the triton backend bundles every op"


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_every_constexpr_global_of_the_kernels_equals_itself():
    """A compiled kernel re-reads the module globals it used at every launch and refuses to run when one
    compares unequal to its compile-time value, so a NaN global fails every launch on a GPU (the
    interpreter does not check). The kernels' globals must compare equal to themselves."""
    import pkgutil

    import triton.language as tl

    unequal = []
    for info in pkgutil.walk_packages(triton_backend.__path__, triton_backend.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            inner = getattr(value, "value", value) if isinstance(value, tl.constexpr) else None
            if isinstance(inner, float) and inner != inner:
                unequal.append(f"{info.name}.{name}")
    assert not unequal, f"constexpr globals that never equal their compile-time value: {unequal}"
