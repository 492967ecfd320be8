"""The `fla` adapter (flash-linear-attention as a peer backend): a missing fla is a rejection reason,
fla 0.6.0's refusal of its gated backward on Hopper is a recorded probe rejection (fallback to eager,
GdnBackendError in strict mode), and the adapter passes our call contract to fla's signature.

fla is not installed here and its kernels need a GPU, so these tests put a STAND-IN `fla` package
on sys.path (written below into a temporary directory). It has fla 0.6.0's module layout and
function signatures, computes its forward with gdn's eager ops, records every call, and its gated
backward raises fla's exact Hopper RuntimeError unless `fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1`
is true, as fla's does. The adapter serves cuda and npu; the tests widen that to the host so the
resolver probes the stand-in on the CPU: loader, route, ops and tolerances are the adapter's own.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gdn
import gdn.backends.fla as fla_backend
import gdn.resolve as resolver
from gdn.backends.eager import EAGER
from gdn.calls import PREPARE, L2NormCall
from gdn.gates import GATE_FLOOR

pytestmark = pytest.mark.probe

HOPPER_MESSAGE = (
    "Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for "
    "gated chunk_bwd_dqkwg (see #640). Please upgrade Triton to >= 3.7.1 or "
    "install tilelang: `pip install tilelang`"
)
STANDIN_VERSION = "0.6.0+standin"

STANDIN = {
    "fla/__init__.py": f'''
        """STAND-IN for flash-linear-attention, written by tests/backends/fla/test_fla_backend.py. Not fla."""
        __version__ = "{STANDIN_VERSION}"
        ''',
    "fla/ops/__init__.py": "",
    "fla/ops/common/__init__.py": "",
    "fla/ops/common/chunk_o.py": f'''
        """Stand-in: fla reads this flag at call time; it is False with Triton 3.6 (the H200's)."""
        TRITON_ABOVE_3_7_1 = False


        def check_gated_backward():
            if not TRITON_ABOVE_3_7_1:
                raise RuntimeError({HOPPER_MESSAGE!r})
        ''',
    "fla/ops/gated_delta_rule/__init__.py": '''
        """Stand-in with fla 0.6.0's signatures; the forward is gdn's eager op, every call is recorded."""
        import torch

        from fla.ops.common import chunk_o
        from gdn.backends.eager import EAGER
        from gdn.calls import PREPARE, L2NormCall

        CALLS = []


        class _GatedBackward(torch.autograd.Function):
            """Identity forward; the backward refuses as fla 0.6.0's does on Hopper."""

            @staticmethod
            def forward(ctx, o):
                return o.view_as(o)

            @staticmethod
            def backward(ctx, do):
                chunk_o.check_gated_backward()
                return do


        def _eager(op, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel):
            call = PREPARE[op](
                q, k, v, g, beta=beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            )
            return EAGER.ops[op](call)


        def chunk_gated_delta_rule(
            q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
            state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, cp_context=None,
            **kwargs,
        ):
            CALLS.append(("chunk_gated_delta_rule", dict(locals())))
            o, final_state = _eager(
                "chunk_gated_delta_rule", q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens,
                use_qk_l2norm_in_kernel,
            )
            return _GatedBackward.apply(o), final_state


        def fused_recurrent_gated_delta_rule(
            q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False, cu_seqlens=None, **kwargs,
        ):
            CALLS.append(("fused_recurrent_gated_delta_rule", dict(locals())))
            return _eager(
                "fused_recurrent_gated_delta_rule", q, k, v, g, beta, scale, initial_state, output_final_state,
                cu_seqlens, use_qk_l2norm_in_kernel,
            )
        ''',
}
STANDIN_L2NORM = {
    "fla/modules/__init__.py": "",
    "fla/modules/l2norm.py": '''
        """Stand-in for fla.modules.l2norm (the 0.6.0 alias of fla.modules.norm.l2norm)."""
        from gdn.backends.eager import EAGER
        from gdn.calls import L2NormCall


        def l2norm(x, eps=1e-6, output_dtype=None):
            return EAGER.ops["l2norm"](L2NormCall(x, eps))
        ''',
}


def _forget_fla() -> None:
    for name in [n for n in sys.modules if n == "fla" or n.startswith("fla.")]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    monkeypatch.delenv(resolver.MODE_ENV, raising=False)
    monkeypatch.delenv(resolver.STRICT_ENV, raising=False)
    gdn.set_compute_mode(None)
    resolver.reset()
    original = resolver.backends()["fla"]
    saved = {n: m for n, m in sys.modules.items() if n == "fla" or n.startswith("fla.")}
    _forget_fla()  # a real fla, where installed, must not shadow the stand-in
    yield
    _forget_fla()
    sys.modules.update(saved)
    gdn.register_backend(original, replace=True)
    gdn.set_compute_mode(None)
    resolver.reset()


def install_standin(root: Path, monkeypatch, *, with_l2norm: bool = True):
    files = {**STANDIN, **(STANDIN_L2NORM if with_l2norm else {})}
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(root))
    import fla.ops.gated_delta_rule as standin

    return standin


def on_host():
    """The adapter, widened to serve (and in auto, to rank first on) the host: see the module doc."""
    backend = dataclasses.replace(fla_backend.FlaBackend(), devices=("cpu",), auto_rank={"cpu": 0})
    gdn.register_backend(backend, replace=True)
    return backend


def gdn_inputs(gen, *, B=1, T=24, H=2, HV=4, K=16, V=16, N=None):
    N = B if N is None else N
    return dict(
        q=torch.randn(B, T, H, K, generator=gen),
        k=torch.randn(B, T, H, K, generator=gen),
        v=torch.randn(B, T, HV, V, generator=gen),
        g=-torch.rand(B, T, HV, generator=gen) * 0.5,
        beta=torch.rand(B, T, HV, generator=gen),
        initial_state=torch.randn(N, HV, K, V, generator=gen) * 0.1,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )


def eager_result(op, inputs):
    call = PREPARE[op](**inputs)
    return EAGER.ops[op](call)


def chunk_record():
    [record] = [r for r in gdn.resolutions() if r["op"] == "chunk_gated_delta_rule"]
    return record


# ---------------------------------------------------------------------------------------------------
# registration


def test_registered_for_cuda_and_npu_after_triton():
    backends = resolver.backends()
    fla, triton = backends["fla"], backends["triton"]
    assert fla.devices == ("cuda", "npu")
    assert "cpu" not in fla.auto_rank
    assert fla.auto_rank["cuda"] > triton.auto_rank["cuda"]
    assert fla.auto_rank["npu"] > triton.auto_rank["npu"]
    assert fla.why_unavailable("cpu") == "serves devices ['cuda', 'npu'], not cpu"


# ---------------------------------------------------------------------------------------------------
# unavailable and refusing fla


@pytest.mark.parametrize("mode", ["fla", "auto"])
def test_missing_fla_is_a_rejection_reason_not_a_crash(monkeypatch, gen, mode):
    # `import fla` fails as if it were not installed (clean_state removes the marker again)
    sys.modules["fla"] = None
    on_host()
    gdn.set_compute_mode(mode)
    inputs = gdn_inputs(gen)
    out, state = gdn.chunk_gated_delta_rule(**inputs)
    ref_out, ref_state = eager_result("chunk_gated_delta_rule", inputs)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(state, ref_state)
    record = chunk_record()
    assert record["backend"] == "eager"
    [rejection] = record["rejected"]
    assert rejection["backend"] == "fla"
    assert rejection["reason"].startswith("ModuleNotFoundError") and "fla" in rejection["reason"]
    assert rejection["probe"] is None


@pytest.mark.parametrize("mode", ["fla", "auto"])
def test_hopper_refusal_is_recorded_with_its_message_and_eager_runs(tmp_path, monkeypatch, gen, mode):
    install_standin(tmp_path, monkeypatch)
    on_host()
    gdn.set_compute_mode(mode)
    inputs = gdn_inputs(gen)
    out, state = gdn.chunk_gated_delta_rule(**inputs)
    ref_out, ref_state = eager_result("chunk_gated_delta_rule", inputs)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(state, ref_state)

    record = chunk_record()
    assert record["backend"] == "eager" and record["route"] == "eager"
    [rejection] = record["rejected"]
    assert rejection["backend"] == "fla"
    assert rejection["route"] == f"fla:{STANDIN_VERSION}"
    # the forward passed the probe; the backward's refusal is the reason, with fla's whole message
    assert rejection["reason"] == f"numeric probe failed: dense: raised RuntimeError: {HOPPER_MESSAGE}"
    assert rejection["probe"]["passed"] is False
    assert rejection["probe"]["reason"] == f"dense: raised RuntimeError: {HOPPER_MESSAGE}"


def test_strict_mode_turns_the_refusal_into_an_error(tmp_path, monkeypatch, gen):
    install_standin(tmp_path, monkeypatch)
    on_host()
    gdn.set_compute_mode("fla")
    monkeypatch.setenv(resolver.STRICT_ENV, "1")
    with pytest.raises(gdn.GdnBackendError) as excinfo:
        gdn.chunk_gated_delta_rule(**gdn_inputs(gen))
    assert "backend 'fla' rejected" in str(excinfo.value)
    assert HOPPER_MESSAGE in str(excinfo.value)


def test_bypass_lifts_the_guard_only_inside_the_block(tmp_path, monkeypatch, gen):
    install_standin(tmp_path, monkeypatch)
    chunk = on_host().implementation("chunk_gated_delta_rule")
    inputs = gdn_inputs(gen)
    inputs["q"].requires_grad_(True)
    call = PREPARE["chunk_gated_delta_rule"](**inputs)

    with fla_backend.bypass_hopper_guard() as lifted:
        out, _ = chunk(call)
        (dq,) = torch.autograd.grad(out.sum(), inputs["q"])
    assert lifted is True
    ref_out, _ = eager_result("chunk_gated_delta_rule", inputs)
    (ref_dq,) = torch.autograd.grad(ref_out.sum(), inputs["q"])
    torch.testing.assert_close(dq, ref_dq)

    out, _ = chunk(call)
    with pytest.raises(RuntimeError, match="see #640"):
        out.sum().backward()


def test_bypass_is_a_no_op_for_an_fla_without_the_guard(tmp_path, monkeypatch):
    install_standin(tmp_path, monkeypatch)
    from fla.ops.common import chunk_o

    monkeypatch.delattr(chunk_o, "TRITON_ABOVE_3_7_1")
    with fla_backend.bypass_hopper_guard() as lifted:
        assert lifted is False
    assert not hasattr(chunk_o, "TRITON_ABOVE_3_7_1")


# ---------------------------------------------------------------------------------------------------
# argument plumbing


@pytest.mark.parametrize("int32_offsets", [False, True])
@pytest.mark.parametrize("op", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
def test_adapter_passes_our_contract_to_flas_signature(tmp_path, monkeypatch, gen, op, int32_offsets):
    standin = install_standin(tmp_path, monkeypatch)
    impl = on_host().implementation(op)
    cu_seqlens = torch.tensor([0, 5, 5, 24], dtype=torch.int32 if int32_offsets else torch.int64)
    inputs = {**gdn_inputs(gen, N=3), "cu_seqlens": cu_seqlens, "scale": 0.3}
    call = PREPARE[op](**inputs)

    out, state = impl(call)

    [(name, seen)] = standin.CALLS
    assert name == op
    for arg in ("q", "k", "v", "beta", "initial_state"):
        assert seen[arg] is inputs[arg], arg  # GVA: v keeps its HV heads, nothing is repeated
    # the chunk op's gates go through the floor (a test below), a copy equal to them here
    assert seen["g"] is inputs["g"] if op == "fused_recurrent_gated_delta_rule" else torch.equal(seen["g"], inputs["g"])
    assert seen["scale"] == 0.3
    assert seen["output_final_state"] is True
    assert seen["use_qk_l2norm_in_kernel"] is True
    assert seen["cu_seqlens"].dtype == torch.int64
    assert seen["cu_seqlens"].tolist() == [0, 5, 5, 24]
    assert seen["kwargs"] == {}  # nothing fla does not know
    if op == "fused_recurrent_gated_delta_rule":
        assert seen["gk"] is None and seen["gv"] is None  # beta did not land in gk
    ref_out, ref_state = eager_result(op, inputs)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(state, ref_state)


@pytest.mark.parametrize("op", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
def test_a_complete_decay_reaches_flas_chunk_kernel_floored(tmp_path, monkeypatch, gen, op):
    """A gate of -inf (complete decay): fla's chunk kernels take differences of cumulative gates, where
    -inf - -inf is NaN, so the adapter hands them the gates floored (gdn.gates); its recurrent kernel
    takes exp(g) per token and gets -inf as it is. The stand-in computes with eager, so this holds
    what each kernel is handed and the gradient at the gate (0, as exp's slope at -inf)."""
    standin = install_standin(tmp_path, monkeypatch)
    impl = on_host().implementation(op)
    inputs = gdn_inputs(gen)
    inputs["g"][0, [0, 7, 23], 1] = float("-inf")
    inputs["g"].requires_grad_(op == "chunk_gated_delta_rule")
    out, state = impl(PREPARE[op](**inputs))
    [(_, seen)] = standin.CALLS
    if op == "chunk_gated_delta_rule":
        assert torch.equal(seen["g"], inputs["g"].clamp_min(GATE_FLOOR))
        with fla_backend.bypass_hopper_guard():  # the stand-in's gated backward refuses as fla 0.6.0's
            out.sum().backward()
        assert inputs["g"].grad.isfinite().all() and not inputs["g"].grad[0, [0, 7, 23], 1].any()
    else:
        assert seen["g"] is inputs["g"]
    assert out.isfinite().all() and state.isfinite().all()


def test_fused_recurrent_resolves_to_fla_when_its_probe_passes(tmp_path, monkeypatch, gen):
    # The recurrent op is forward-only, so the stand-in's refusing backward never runs.
    install_standin(tmp_path, monkeypatch)
    on_host()
    gdn.set_compute_mode("fla")
    monkeypatch.setenv(resolver.STRICT_ENV, "1")
    gdn.fused_recurrent_gated_delta_rule(**gdn_inputs(gen))
    [record] = [r for r in gdn.resolutions() if r["op"] == "fused_recurrent_gated_delta_rule"]
    assert record["backend"] == "fla" and record["route"] == f"fla:{STANDIN_VERSION}"
    assert record["probe"]["passed"] is True


def test_offsets_reach_flas_kernels_only_checked_whatever_the_check_mode(tmp_path, monkeypatch, gen):
    """fla's kernels read cu_seqlens on the device unchecked (Backend.trusts_values): GDN_VALUE_CHECKS=0
    still runs the host check before fla is called, and a CUDA-graph capture, where that check cannot
    run, refuses the call."""
    from gdn import _validate

    standin = install_standin(tmp_path, monkeypatch)
    on_host()
    gdn.set_compute_mode("fla")
    monkeypatch.setenv(resolver.STRICT_ENV, "1")
    inputs = {**gdn_inputs(gen, N=3), "cu_seqlens": torch.tensor([0, 5, 5, 24])}
    gdn.fused_recurrent_gated_delta_rule(**inputs)
    assert gdn.resolutions()[0]["backend"] == "fla"
    seen = len(standin.CALLS)
    monkeypatch.setenv("GDN_VALUE_CHECKS", "0")
    inputs["cu_seqlens"] = torch.tensor([0, 20, 5, 24])
    with pytest.raises(ValueError, match="argument 'cu_seqlens' expected non-decreasing offsets"):
        gdn.fused_recurrent_gated_delta_rule(**inputs)
    monkeypatch.setattr(_validate, "_capturing", lambda: True)
    with pytest.raises(RuntimeError, match=r"on backend 'fla'.*captured"):
        gdn.fused_recurrent_gated_delta_rule(**inputs)
    assert len(standin.CALLS) == seen  # fla never saw them


@pytest.mark.parametrize("with_l2norm", [True, False])
def test_l2norm_is_offered_only_when_fla_has_it(tmp_path, monkeypatch, gen, with_l2norm):
    install_standin(tmp_path, monkeypatch, with_l2norm=with_l2norm)
    on_host()
    gdn.set_compute_mode("fla")
    x = torch.randn(6, 32, generator=gen)
    torch.testing.assert_close(gdn.l2norm(x), EAGER.ops["l2norm"](L2NormCall(x)))
    [record] = [r for r in gdn.resolutions() if r["op"] == "l2norm"]
    if with_l2norm:
        assert record["backend"] == "fla" and record["probe"]["passed"] is True
    else:
        assert record["backend"] == "eager"
        assert record["rejected"][0]["reason"] == "does not implement l2norm"
