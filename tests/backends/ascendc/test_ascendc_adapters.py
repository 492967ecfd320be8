"""The ascendc adapters against eager, in process: each route's raw ops are the stand-in kernels
(tests/standins), which compute the AscendC ops' contracts and refuse what the real ops refuse (fp32
operands, device tensors where host int lists belong, empty sequences, chunk indices that do not
match cu_seqlens, shapes outside the ops' limits). Outputs and gradients agreeing with eager to bf16
rounding proves the plumbing:
layouts and transposes, the tensors saved for the backward, the host lists and the empty-sequence
handling. The kernels run in bf16, so the tolerance is a bf16 one (observed errors ~4e-3; a wrong
layout or a missing term costs O(1))."""

from __future__ import annotations

import pytest
import torch

from gdn.backends.ascendc import chunk as chunk_module
from gdn.backends.ascendc.chunk import ChunkKernels, make_chunk_gated_delta_rule, refusal_of
from gdn.backends.ascendc.contracts import ContractError
from gdn.backends.ascendc.conv import ConvKernels, make_causal_conv1d_fn
from gdn.backends.ascendc.recurrent import make_recurrent_ops
from gdn.calls import PREPARE
from standins import kernels_conv
from standins.support import Counted, compare_with_eager, legacy, stable

pytestmark = pytest.mark.single_op

TOL = 1.2e-2
# dg is a reverse cumulative sum whose terms cancel, so its bf16 error relative to its own norm has a
# long tail the other outputs lack: median 3.5e-3, max 9.2e-3 over 1,200 random cases, 1.4e-2 seen once
# in CI. A wrong layout or a missing term still costs O(1).
DG_TOL = 3e-2
CHUNK = "chunk_gated_delta_rule"
CONV = "causal_conv1d_fn"
CHUNK_GRADS = ("q", "k", "v", "g", "beta", "initial_state")


# the chain's and the recurrent op's head dims (K = 128, V in {128, 256}; Dk = Dv = 128 on the stable API)
def gdn_inputs(gen, *, B=1, T=150, H=2, HV=4, K=128, V=128, cu=None, dtype=torch.float32, state=True, final=True):
    N = B if cu is None else len(cu) - 1
    return dict(
        q=torch.randn(B, T, H, K, generator=gen).to(dtype),
        k=torch.randn(B, T, H, K, generator=gen).to(dtype),
        v=torch.randn(B, T, HV, V, generator=gen).to(dtype),
        g=-torch.rand(B, T, HV, generator=gen) * 0.5,
        beta=torch.rand(B, T, HV, generator=gen).to(dtype),
        initial_state=torch.randn(N, HV, K, V, generator=gen) * 0.1 if state else None,
        output_final_state=final,
        cu_seqlens=None if cu is None else torch.tensor(cu),
        use_qk_l2norm_in_kernel=True,
    )


def compare_chunk(fn, inputs: dict, grads: tuple[str, ...]) -> dict[str, float]:
    """Outputs (the final state among them) and gradients against eager. The route refuses a final
    state that needs a gradient (bwd_dhu ignores dht), so a call that returns the final state is
    compared forward only and its gradients without the final state."""
    if not inputs["output_final_state"]:
        return compare_with_eager(CHUNK, fn, inputs, grads)
    forward = compare_with_eager(CHUNK, fn, inputs)
    backward = compare_with_eager(CHUNK, fn, {**inputs, "output_final_state": False}, grads)
    return {f"final_state_call.{k}": v for k, v in forward.items()} | backward


def assert_close(errors: dict[str, float], tol: float = TOL) -> None:
    bad = {name: err for name, err in errors.items() if not err < (max(tol, DG_TOL) if name == "dg" else tol)}
    assert errors and not bad, errors


# ---------------------------------------------------------------------------------------------------
# chunk_gated_delta_rule

CHUNK_CASES = {
    "dense": dict(B=2, T=100),
    "varlen_empty_sequences": dict(T=150, cu=[0, 0, 17, 17, 90, 150]),
    "one_head_group": dict(B=1, T=70, H=4, HV=4),
    "no_state": dict(B=2, T=65, state=False, final=False),
    "state_in_not_out": dict(B=1, T=40, final=False),
}


@pytest.mark.parametrize("route", ["stable", "legacy"])
@pytest.mark.parametrize("case", sorted(CHUNK_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decomposed_chunk_matches_eager(gen, route, case, dtype):
    ops = stable() if route == "stable" else legacy()
    fn = make_chunk_gated_delta_rule(ChunkKernels.bind(ops))
    inputs = gdn_inputs(gen, dtype=dtype, **CHUNK_CASES[case])
    grads = tuple(n for n in CHUNK_GRADS if inputs.get(n) is not None)
    assert_close(compare_chunk(fn, inputs, grads))


@pytest.mark.parametrize("case", ["dense_v128", "varlen_v256"])
def test_composite_forward_matches_eager_and_is_used(gen, case):
    ops = stable()
    composite = Counted(ops.get("npu_chunk_gated_delta_rule_fwd"))
    kernels = ChunkKernels.bind(ops, ops)
    fn = make_chunk_gated_delta_rule(ChunkKernels(**{**vars(kernels), "composite": composite}))
    shape = dict(B=2, T=80, K=128, V=128) if case == "dense_v128" else dict(T=140, K=128, V=256, cu=[0, 70, 70, 140])
    inputs = gdn_inputs(gen, **shape)
    assert_close(compare_chunk(fn, inputs, CHUNK_GRADS))
    assert len(composite.calls) == 2  # with the final state (forward only) and without (gradients)
    _, kwargs = composite.calls[0]
    assert kwargs["layout"] == "BSND" and kwargs["disable_recompute"] is True
    assert kwargs["use_qk_l2norm_in_kernel"] is False and kwargs["use_exp2"] is False
    if case == "varlen_v256":  # the empty sequence is dropped from the host lists
        assert kwargs["cu_seqlens"] == [0, 70, 140]
        assert kwargs["chunk_indices"] == [0, 0, 0, 1, 1, 0, 1, 1]


@pytest.mark.parametrize(("K", "V"), [(64, 128), (128, 96), (32, 32)])
def test_head_dims_outside_the_chain_limits_are_refused(gen, K, V):
    ops = stable()
    composite = Counted(ops.get("npu_chunk_gated_delta_rule_fwd"))
    kernels = ChunkKernels(**{**vars(ChunkKernels.bind(ops, ops)), "composite": composite})
    args = {k: (v.requires_grad_() if k in CHUNK_GRADS else v) for k, v in gdn_inputs(gen, T=40, K=K, V=V).items()}
    call = PREPARE[CHUNK](**args)
    reason = refusal_of(kernels)(call)
    bad = f"K = {K}" if K != 128 else f"V = {V}"
    assert reason is not None and f"{bad} is outside its limits" in reason
    # a direct call never reaches the kernels (gdn.resolve hands a refused call to the next backend)
    with pytest.raises(ContractError, match=f"{bad} is outside its limits"):
        make_chunk_gated_delta_rule(kernels)(call)
    assert composite.calls == []


def test_a_final_state_gradient_is_refused_and_a_final_state_alone_is_not(gen):
    kernels = ChunkKernels.bind(legacy())
    args = {k: (v.requires_grad_() if k in CHUNK_GRADS else v) for k, v in gdn_inputs(gen, T=40).items()}
    assert "ignores dht" in refusal_of(kernels)(PREPARE[CHUNK](**args))
    assert refusal_of(kernels)(PREPARE[CHUNK](**{**args, "output_final_state": False})) is None
    with torch.no_grad():  # inference: no gradient can reach the final state
        assert refusal_of(kernels)(PREPARE[CHUNK](**args)) is None


@pytest.mark.parametrize("composite", [False, True])
def test_forward_saves_exactly_what_the_backward_needs(gen, composite):
    ops = stable()
    fn = make_chunk_gated_delta_rule(ChunkKernels.bind(ops, ops if composite else None))
    B, T, H, HV, K, V = 1, 150, 2, 4, 128, 128
    inputs = gdn_inputs(gen, B=B, T=T, H=H, HV=HV, K=K, V=V, cu=[0, 50, 150], final=False)
    args = {k: (v.requires_grad_() if k in CHUNK_GRADS else v) for k, v in inputs.items()}
    call = PREPARE[CHUNK](**args)
    o, _ = fn(call)
    node = o.grad_fn
    while not hasattr(node, "saved_tensors"):  # past the casts to the Function's node
        node = node.next_functions[0][0]
    q, k, v, g_cum, beta, A, h0 = node.saved_tensors
    if composite:  # the composite's own layout: token-major inputs, its g_cumsum and A
        assert (q.shape, k.shape, v.shape) == ((B, T, H, K), (B, T, H, K), (B, T, HV, V))
        assert (g_cum.shape, beta.shape) == ((B, T, HV), (B, T, HV))
    else:  # the head-first copies the forward made for its own ops
        assert (q.shape, k.shape, v.shape) == ((B, H, T, K), (B, H, T, K), (B, HV, T, V))
        assert (g_cum.shape, beta.shape) == ((B, HV, T), (B, HV, T))
    assert A.shape == (B, HV, T, 64) and A.dtype == torch.bfloat16
    assert g_cum.dtype == torch.float32 and h0.shape == (2, HV, K, V)


def test_a_missing_transpose_is_caught(gen, monkeypatch):
    # the oracle can fail: feeding the head-first chain token-major tensors must not pass
    monkeypatch.setattr(chunk_module, "_head_first", lambda x: x.contiguous())
    fn = make_chunk_gated_delta_rule(ChunkKernels.bind(stable()))
    with pytest.raises(ContractError, match=r"must be \[B, HV, T\] with T = 2"):
        compare_with_eager(CHUNK, fn, gdn_inputs(gen, B=2, T=64, final=False), CHUNK_GRADS)


# ---------------------------------------------------------------------------------------------------
# causal_conv1d_fn

CONV_FLAVOURS = {
    "stable_fn": lambda: ConvKernels.bind(stable()),
    "stable_raw_host_lists": lambda: ConvKernels.bind(stable(conv_fn=False)),
    "legacy_per_sequence": lambda: ConvKernels.bind(legacy()),
}


def conv_dense(gen, *, seq_idx=False, initial=True, bias=True, dtype=torch.float32):
    B, D, T, W = 2, 48, 37, 4
    inputs = dict(
        x=torch.randn(B, D, T, generator=gen).to(dtype),
        weight=torch.randn(D, W, generator=gen).to(dtype),
        bias=torch.randn(D, generator=gen).to(dtype) if bias else None,
        activation="silu",
        initial_states=torch.randn(B, D, W - 1, generator=gen).to(dtype) if initial else None,
        return_final_states=True,
    )
    if seq_idx:
        inputs["seq_idx"] = torch.tensor([[0] * 10 + [1] * 2 + [2] * 25, [5] * 37], dtype=torch.int32)
    grads = tuple(n for n in ("x", "weight", "bias", "initial_states") if inputs[n] is not None)
    return inputs, grads


def conv_varlen(gen):
    D, W = 48, 4
    return dict(
        x=torch.randn(D, 42, generator=gen),
        weight=torch.randn(D, W, generator=gen),
        bias=None,
        activation=None,
        query_start_loc=torch.tensor([0, 2, 2, 30, 42], dtype=torch.int32),
        conv_states=torch.randn(6, D, W - 1, generator=gen),
        cache_indices=torch.tensor([4, 1, -1, 0]),
        has_initial_state=torch.tensor([True, False, True, True]),
    )


@pytest.mark.parametrize("flavour", sorted(CONV_FLAVOURS))
@pytest.mark.parametrize(
    "case", ["dense", "dense_seq_idx", "dense_no_history_no_bias", "dense_bf16", "varlen_pool_empty_and_skipped"]
)
def test_conv_matches_eager(gen, flavour, case):
    fn = make_causal_conv1d_fn(CONV_FLAVOURS[flavour]())
    if case == "varlen_pool_empty_and_skipped":
        inputs, grads = conv_varlen(gen), ("x", "weight")
    else:
        options = {
            "dense": {},
            "dense_seq_idx": dict(seq_idx=True),
            "dense_no_history_no_bias": dict(initial=False, bias=False),
            "dense_bf16": dict(dtype=torch.bfloat16),
        }[case]
        inputs, grads = conv_dense(gen, **options)
    assert_close(compare_with_eager(CONV, fn, inputs, grads))


def test_legacy_conv_backward_runs_per_sequence(gen):
    backward = Counted(kernels_conv.npu_causal_conv1d_bwd)
    kernels = ConvKernels.bind(legacy(npu_causal_conv1d_bwd=backward))
    inputs, grads = conv_dense(gen, seq_idx=True)
    assert_close(compare_with_eager(CONV, make_causal_conv1d_fn(kernels), inputs, grads))
    # 26.6's accurate dw: one call per sequence (4 sequences in two rows), each alone in its call
    assert [kw["query_start_loc"] for _, kw in backward.calls] == [[0, 10], [0, 2], [0, 25], [0, 37]]
    assert all(kw["input_layout"] == "NTD" and kw["activation"] == 0 for _, kw in backward.calls)


def test_stable_conv_passes_the_host_metadata_only(gen):
    # later builds refuse a device tensor together with its `_cpu` twin ("mutually exclusive")
    fn_entry = Counted(kernels_conv.npu_causal_conv1d_fn)
    kernels = ConvKernels.bind(stable(npu_causal_conv1d_fn=fn_entry))
    assert kernels.entry == "fla_npu.ops.ascendc.npu_causal_conv1d_fn"
    assert_close(compare_with_eager(CONV, make_causal_conv1d_fn(kernels), conv_varlen(gen)))
    _, kwargs = fn_entry.calls[0]
    for name in ("query_start_loc", "cache_indices", "has_initial_state"):
        assert kwargs.get(name) is None, name
    assert kwargs["query_start_loc_cpu"] == [0, 2, 30, 42]  # the empty sequence never reaches the kernel
    assert kwargs["cache_indices_cpu"] == [0, 1, 2] and kwargs["has_initial_state_cpu"] == [1, 1, 1]
    assert kwargs["activation"] is None  # silu runs in torch, so the backward op needs no pre-activation


# ---------------------------------------------------------------------------------------------------
# the decode ops


# One token from a zero state: 16 sequences, not 3, since the relative error over three output rows is
# a few bf16 roundings with a long tail (max 0.011 over 400 seeds, 0.014 seen in CI); over 16 rows its
# max was 0.0053 over 1,000 seeds. A wrong layout or a missing term still costs O(1).
@pytest.mark.parametrize(
    "case", [dict(B=2, T=5), dict(T=9, cu=[0, 0, 4, 4, 9]), dict(B=16, T=1, state=False), dict(B=1, T=6, final=False)]
)
def test_recurrent_matches_eager(gen, case):
    op = "fused_recurrent_gated_delta_rule"
    fn = make_recurrent_ops(stable().get("npu_recurrent_gated_delta_rule"))[op]
    assert_close(compare_with_eager(op, fn, gdn_inputs(gen, **case)))


@pytest.mark.parametrize("state_v_first", [False, True])
def test_pool_decode_matches_eager_and_leaves_other_rows(gen, state_v_first):
    """Also on a value-first pool ([slots, HV, V, K]): the adapter gets it as a transposed view and
    writes it in place through that view."""
    ops = make_recurrent_ops(stable().get("npu_recurrent_gated_delta_rule"))
    base = gdn_inputs(gen, T=7, cu=[0, 3, 3, 4, 7], state=False)
    inputs = {k: base[k] for k in ("q", "k", "v", "g", "beta", "cu_seqlens", "use_qk_l2norm_in_kernel")}
    inputs |= dict(ssm_pool=torch.randn(6, 4, 128, 128, generator=gen) * 0.1, ssm_indices=torch.tensor([2, 5, -1, 0]))
    inputs |= dict(state_v_first=state_v_first)
    op = "fused_recurrent_gated_delta_rule_update"
    assert_close(compare_with_eager(op, ops[op], inputs))


def test_recurrent_takes_a_value_first_state(gen):
    op = "fused_recurrent_gated_delta_rule"
    fn = make_recurrent_ops(stable().get("npu_recurrent_gated_delta_rule"))[op]
    inputs = gdn_inputs(gen, T=9, cu=[0, 0, 4, 4, 9])
    inputs |= dict(initial_state=inputs["initial_state"].transpose(-1, -2).contiguous(), state_v_first=True)
    assert_close(compare_with_eager(op, fn, inputs))


def test_recurrent_refuses_inputs_that_require_grad(gen):
    ops = make_recurrent_ops(stable().get("npu_recurrent_gated_delta_rule"))
    inputs = gdn_inputs(gen, B=1, T=3)
    with pytest.raises(RuntimeError, match="no backward"):
        compare_with_eager("fused_recurrent_gated_delta_rule", ops["fused_recurrent_gated_delta_rule"], inputs, ("q",))
