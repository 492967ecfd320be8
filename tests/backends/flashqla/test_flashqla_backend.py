"""The `flashqla` adapter (FlashQLA as a peer backend): registered for cuda after triton and fla, the
chunk op only, our contract passed to FlashQLA's signature, calls it cannot take refused per call
(the next candidate runs them, the reason is logged and counted in the op's record; strict mode
raises), probed against eager in bf16 at K = V = 128.

FlashQLA needs a Hopper or Blackwell GPU, so these tests put the labelled STAND-IN flash_qla of
tests/peer_standins/flashqla_site on sys.path (it computes with gdn's eager op and records each call)
and widen the adapter to the host, as tests/backends/fla/test_fla_backend.py does for fla.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

import gdn
import gdn.backends.flashqla as flashqla_backend
import gdn.resolve as resolver
from gdn.backends.eager import EAGER
from gdn.calls import PREPARE
from gdn.gates import GATE_FLOOR
from repo_paths import TESTS

pytestmark = pytest.mark.probe

SITE = TESTS / "peer_standins" / "flashqla_site"
OP = "chunk_gated_delta_rule"


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    monkeypatch.delenv(resolver.MODE_ENV, raising=False)
    monkeypatch.delenv(resolver.STRICT_ENV, raising=False)
    gdn.set_compute_mode(None)
    resolver.reset()
    original = resolver.backends()["flashqla"]
    saved = {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("flash_qla", "tilelang")}
    for name in saved:
        del sys.modules[name]
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("flash_qla", "tilelang")]:
        del sys.modules[name]
    sys.modules.update(saved)
    gdn.register_backend(original, replace=True)
    gdn.set_compute_mode(None)
    resolver.reset()


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.syspath_prepend(str(SITE))
    import flash_qla

    assert flash_qla.__gdn_stand_in__
    flash_qla.CALLS.clear()
    return flash_qla


def on_host():
    backend = dataclasses.replace(flashqla_backend.FlashQLABackend(), devices=("cpu",), auto_rank={"cpu": 0})
    gdn.register_backend(backend, replace=True)
    return backend


def inputs(gen, *, dtype=torch.bfloat16, B=1, T=24, H=2, HV=4, D=128, N=None, final=True):
    N = B if N is None else N
    return dict(
        q=torch.randn(B, T, H, D, generator=gen).to(dtype),
        k=torch.randn(B, T, H, D, generator=gen).to(dtype),
        v=torch.randn(B, T, HV, D, generator=gen).to(dtype),
        g=-torch.rand(B, T, HV, generator=gen) * 0.5,
        beta=torch.rand(B, T, HV, generator=gen).to(dtype),
        initial_state=torch.randn(N, HV, D, D, generator=gen) * 0.1,
        output_final_state=final,
        use_qk_l2norm_in_kernel=True,
    )


def eager(args):
    call = PREPARE[OP](**args)
    return EAGER.ops[OP](call)


def test_registered_for_cuda_after_triton_and_fla():
    backends = resolver.backends()
    flashqla = backends["flashqla"]
    assert flashqla.devices == ("cuda",)
    assert flashqla.auto_rank["cuda"] > backends["fla"].auto_rank["cuda"] > backends["triton"].auto_rank["cuda"]
    assert flashqla.why_unavailable("cpu") == "serves devices ['cuda'], not cpu"
    assert flashqla.probe_dtype == torch.bfloat16 and flashqla.probe_head_dims == (128, 128)


def test_missing_flash_qla_is_a_rejection_reason(monkeypatch, gen):
    sys.modules["flash_qla"] = None
    on_host()
    gdn.set_compute_mode("flashqla")
    gdn.chunk_gated_delta_rule(**inputs(gen))
    [record] = [r for r in gdn.resolutions() if r["op"] == OP]
    assert record["backend"] == "eager"
    assert record["rejected"][0]["reason"].startswith("ModuleNotFoundError")


def test_other_ops_are_refused_with_a_reason(standin, gen):
    on_host()
    gdn.set_compute_mode("flashqla")
    x = torch.randn(4, 32, generator=gen)
    gdn.l2norm(x)
    [record] = [r for r in gdn.resolutions() if r["op"] == "l2norm"]
    assert record["backend"] == "eager"
    assert record["rejected"][0]["reason"] == "FlashQLA has chunked prefill kernels only (no l2norm)"


@pytest.mark.parametrize("int32_offsets", [False, True])
def test_contract_reaches_flashqlas_signature(standin, gen, int32_offsets):
    impl = on_host().implementation(OP)
    cu = torch.tensor([0, 5, 24], dtype=torch.int32 if int32_offsets else torch.int64)
    args = {**inputs(gen, N=2), "cu_seqlens": cu, "scale": 0.3}
    call = PREPARE[OP](**args)
    out, state = impl(call)
    [seen] = standin.CALLS
    for name in ("q", "k", "v", "beta", "initial_state"):
        assert seen[name] is args[name], name  # GVA: v keeps its HV heads
    assert torch.equal(seen["g"], args["g"])  # through the floor (below): a copy, equal here
    assert seen["scale"] == 0.3 and seen["output_final_state"] is True and seen["use_qk_l2norm_in_kernel"] is True
    assert seen["cu_seqlens"].dtype == torch.int64 and seen["cu_seqlens"].tolist() == [0, 5, 24]
    assert seen["head_first"] is False and seen["cp_context"] is None
    ref_out, ref_state = eager(args)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(state, ref_state)


@pytest.mark.parametrize(
    ("dtype", "D", "reason"),
    [
        (torch.float32, 128, "FlashQLA takes q, k, v all bfloat16 or all float16, got torch.float32"),
        (torch.bfloat16, 64, "FlashQLA takes K = V = 128 only, got K = 64, V = 64"),
    ],
)
def test_calls_it_cannot_take_run_on_the_next_backend_and_are_counted(standin, gen, caplog, dtype, D, reason):
    on_host()
    gdn.set_compute_mode("flashqla")
    args = inputs(gen, dtype=dtype, D=D)
    resolver.resolve(OP, "cpu")  # the probe's own calls reach FlashQLA
    flash_qla_calls = len(standin.CALLS)
    for _ in range(2):
        out, state = gdn.chunk_gated_delta_rule(**args)
    assert len(standin.CALLS) == flash_qla_calls  # FlashQLA never saw them
    ref_out, ref_state = eager(args)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(state, ref_state)
    [record] = [r for r in gdn.resolutions() if r["op"] == OP]
    assert record["backend"] == "flashqla"
    [refused] = record["refusals"]
    assert refused["reason"].startswith(reason) and refused["count"] == 2 and refused["served_by"] == "eager"
    assert sum("flashqla refused a call" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_strict_mode_raises_on_a_refused_call(standin, gen, monkeypatch):
    on_host()
    gdn.set_compute_mode("flashqla")
    monkeypatch.setenv(resolver.STRICT_ENV, "1")
    with pytest.raises(gdn.GdnBackendError, match=r"refused the call \(FlashQLA takes q, k, v all bfloat16"):
        gdn.chunk_gated_delta_rule(**inputs(gen, dtype=torch.float32))


def test_resolves_after_its_bf16_probe_and_serves_training(standin, gen):
    on_host()
    gdn.set_compute_mode("flashqla")
    args = inputs(gen, final=False)
    args["q"].requires_grad_(True)
    out, state = gdn.chunk_gated_delta_rule(**args)
    assert state is None
    out.float().sum().backward()
    [record] = [r for r in gdn.resolutions() if r["op"] == OP]
    assert record["backend"] == "flashqla" and record["route"] == "flashqla:0.1.3"
    assert record["probe"]["passed"] is True
    # the probe's dense and varlen cases (bf16, K = V = 128) and the call above reached the stand-in
    assert len(standin.CALLS) >= 3 and all(c["q"].dtype == torch.bfloat16 for c in standin.CALLS)
    assert args["q"].grad is not None


@pytest.mark.parametrize("with_initial_state", [True, False])
def test_sequences_without_tokens_are_kept_out_of_flashqlas_call(standin, gen, with_initial_state):
    """FlashQLA refuses a sequence of no tokens, which our contract admits (a serving batch can hold
    one): it gets no output rows and its initial state back as its final state, gradients included."""
    impl = on_host().implementation(OP)
    args = {**inputs(gen, N=5), "cu_seqlens": torch.tensor([0, 0, 7, 7, 24, 24])}
    if not with_initial_state:
        args["initial_state"] = None
    names = [n for n in ("q", "v", "g", "initial_state") if args[n] is not None]
    grads = [args[n] for n in names]
    for t in grads:
        t.requires_grad_(True)
    out, state = impl(PREPARE[OP](**args))
    [seen] = standin.CALLS
    assert seen["cu_seqlens"].tolist() == [0, 7, 24]
    ref_out, ref_state = eager(args)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(state, ref_state)
    weights = torch.randn(state.shape, generator=gen)
    got = torch.autograd.grad(out.float().sum() + (state * weights).sum(), grads)
    want = torch.autograd.grad(ref_out.float().sum() + (ref_state * weights).sum(), grads)
    for name, a, b in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_a_complete_decay_reaches_flashqla_floored(standin, gen):
    """A gate of -inf (complete decay): FlashQLA's chunk kernels take differences of cumulative gates,
    where -inf - -inf is NaN, so the adapter hands them the gates floored (gdn.gates). The stand-in
    computes with eager: this holds what FlashQLA is handed and the gradient at the gate (0)."""
    impl = on_host().implementation(OP)
    args = inputs(gen)
    args["g"][0, [0, 9], 1] = float("-inf")
    args["g"].requires_grad_(True)
    out, state = impl(PREPARE[OP](**args))
    [seen] = standin.CALLS
    assert torch.equal(seen["g"], args["g"].detach().clamp_min(GATE_FLOOR))
    out.float().sum().backward()
    assert out.isfinite().all() and state.isfinite().all()
    assert args["g"].grad.isfinite().all() and not args["g"].grad[0, [0, 9], 1].any()


def test_a_half_precision_gate_reaches_flashqla_in_fp32_for_training(standin, gen):
    impl = on_host().implementation(OP)
    args = inputs(gen)
    args["g"] = args["g"].to(torch.bfloat16).requires_grad_(True)
    out, _ = impl(PREPARE[OP](**args))
    [seen] = standin.CALLS
    assert seen["g"].dtype == torch.float32
    out.float().sum().backward()
    assert args["g"].grad.dtype == torch.bfloat16
