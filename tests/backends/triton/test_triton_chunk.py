"""The triton backend's chunk_gated_delta_rule against the fp64 token recurrence: the output, the final
state and every gradient (q, k, v, g, beta, initial state), with ||out - ref|| / ||ref|| <= 1e-4 in
fp32 and 1e-2 in bf16/fp16. Without a CUDA device the kernels run under TRITON_INTERPRET=1, which
must be set before triton is imported (xdist workers import this module themselves).

Also: the launches of every kernel specialize identically across sequence lengths (one compiled
binary per kernel), and the grid of a batch of many sequences stays within the launch limits."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import Counter
from typing import ClassVar

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")

from gdn import numeric_probe  # noqa: E402 - after TRITON_INTERPRET
from gdn import resolve as resolver  # noqa: E402
from gdn.backends.eager import EAGER  # noqa: E402
from gdn.backends.triton import chunk as triton_chunk  # noqa: E402
from gdn.backends.triton import chunk_index, compile_ahead  # noqa: E402
from gdn.backends.triton import l2norm as triton_l2norm  # noqa: E402
from gdn.backends.triton._common import is_interpreting  # noqa: E402
from gdn.backends.triton.chunk_index import plan_chunks, read_back, split_sequences  # noqa: E402
from gdn.backends.triton.common import config, output, qk_grads, state, wy, wy_bwd  # noqa: E402
from gdn.calls import PREPARE  # noqa: E402
from reference import gdn_recurrence, rel_err  # noqa: E402
from triton_harness import run_on_hopper_compiler  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}
# dg and dbeta sum products over a head dimension, which cancel: with half-precision inputs their
# relative error has a long tail. Measured under the interpreter (Triton 3.6, bf16, l2norm, T=100,
# K=V=64), 200 random cases: dg median 4.5e-3, p99 1.10e-2, max 1.16e-2; dbeta median 4.5e-3, max
# 9.4e-3; every other output and gradient at most 7.8e-3. A wrong term is off by O(1).
HALF_REDUCED_GRAD_TOL = {"dg": 2e-2, "dbeta": 2e-2}
GRAD_NAMES = ("q", "k", "v", "g", "beta", "initial_state")
KERNEL_MODULES = (chunk_index, wy, wy_bwd, state, output, qk_grads, triton_l2norm)
# the packed plan's kernels (a packed call's, on the device)
TABLE_KERNELS = {"_offsets_kernel", "_chunk_rows_kernel"}


def triton_op(q, k, v, g, beta, **kwargs):
    """The backend entry called exactly as gdn.chunk_gated_delta_rule calls it, after validation."""
    call = PREPARE["chunk_gated_delta_rule"](q, k, v, g, beta, **kwargs)
    return triton_chunk.chunk_gated_delta_rule(call)


def make_inputs(gen, T, H, HV, K, V, *, B=1, N=None, dtype=torch.float32, with_state=True, g_dtype=torch.float32):
    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = randn(B, T, H, K).to(dtype)
    k = (randn(B, T, H, K) * K**-0.5).to(dtype)  # keys of norm ~1: beta ||k||^2 < 2 keeps the rule stable
    v = randn(B, T, HV, V).to(dtype)
    g = (-torch.rand(B, T, HV, generator=gen) * 0.5).to(g_dtype)
    beta = torch.rand(B, T, HV, generator=gen).to(dtype)
    h0 = randn(N or B, HV, K, V) * 0.1 if with_state else None
    return q, k, v, g, beta, h0


def check_against_recurrence(
    gen, inputs, tol, cu_seqlens=None, scale=None, l2norm=False, tol_of=None, final_state=True
):
    """Forward and backward with random upstream gradients on o and the final state, both sides (on o
    alone without `final_state`: no final state is asked for, as in a training step, and the backward
    gets no gradient for it); `tol_of` overrides the tolerance of named outputs (e.g. {"dg": ...})."""
    q, v = inputs[0], inputs[2]
    N = len(cu_seqlens) - 1 if cu_seqlens is not None else q.shape[0]
    do = torch.randn(v.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(N, v.shape[2], q.shape[3], v.shape[3], generator=gen, dtype=torch.float64)
    if not final_state:
        dht = torch.zeros_like(dht)  # the reference's loss then has no final-state term either

    leaves = [None if x is None else x.detach().clone().to(DEVICE).requires_grad_() for x in inputs]
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32, device=DEVICE)
    o, final = triton_op(
        *leaves[:5],
        scale=scale,
        initial_state=leaves[5],
        output_final_state=final_state,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=l2norm,
    )
    assert o.dtype == v.dtype and (final is None) != final_state
    loss = (o.double().cpu() * do).sum()
    if final_state:
        assert final.dtype == torch.float32
        loss = loss + (final.double().cpu() * dht).sum()
    loss.backward()
    for x, leaf in zip(inputs, leaves, strict=True):
        assert x is None or leaf.grad.dtype == x.dtype

    ref_leaves = [None if x is None else x.detach().double().requires_grad_() for x in inputs]
    cu_ref = None if cu_seqlens is None else torch.tensor(cu_seqlens)
    ro, rfinal = gdn_recurrence(
        *ref_leaves[:5], scale=scale, initial_state=ref_leaves[5], cu_seqlens=cu_ref, l2norm=l2norm
    )
    ((ro * do).sum() + (rfinal * dht).sum()).backward()

    errors = {"o": rel_err(o, ro)}
    if final_state:
        errors["final_state"] = rel_err(final, rfinal)
    for name, leaf, ref in zip(GRAD_NAMES, leaves, ref_leaves, strict=True):
        if leaf is not None:
            errors[f"d{name}"] = rel_err(leaf.grad, ref.grad)
    limits = {name: (tol_of or {}).get(name, tol) for name in errors}
    bad = {name: f"{err:.2e} > {limits[name]}" for name, err in errors.items() if not err <= limits[name]}
    assert not bad, f"rel err over the tolerance: {bad}"


# (T, H, HV, K, V, initial state, l2norm, scale): odd lengths around the chunk size, non-power-of-two
# and large head dims, grouped value heads.
DENSE_CASES = [
    (1, 1, 2, 64, 64, True, False, None),
    (63, 1, 2, 64, 64, False, True, None),
    (65, 1, 2, 64, 64, True, True, 0.3),
    (130, 1, 2, 64, 64, True, False, None),
    (70, 1, 1, 60, 100, True, False, None),
    (70, 1, 1, 100, 60, False, True, None),
    (65, 1, 1, 128, 128, True, True, None),
    (70, 2, 4, 16, 16, True, False, 0.5),
    (40, 1, 3, 32, 32, False, True, None),
]


@pytest.mark.single_op
@pytest.mark.parametrize("l2norm", [False, True])
def test_the_backward_keeps_only_the_normalized_inputs_the_gates_and_the_wy_inverse(l2norm, gen):
    """Beyond the inputs themselves, the forward keeps for the backward only q and k normalized and
    their rstd (with the l2norm), the chunk-local cumulative gate (fp32) and the WY inverse T
    [B, T, HV, 64] in k's dtype: the set FlashQLA 0.1.3 keeps (read from its source). The chunk states,
    the WY factors and v_new are recomputed, never kept."""
    B, T, H, HV, K, V = 2, 70, 2, 4, 32, 16
    inputs = make_inputs(gen, T, H, HV, K, V, B=B, dtype=torch.bfloat16)
    leaves = [x.to(DEVICE).requires_grad_() for x in inputs]
    given = {x.untyped_storage().data_ptr() for x in leaves}
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in given:
            kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        triton_op(*leaves[:5], initial_state=leaves[5], output_final_state=True, use_qk_l2norm_in_kernel=l2norm)
    found = Counter((tuple(t.shape), t.dtype) for t in kept)
    wanted = Counter({((B, T, HV), torch.float32): 1, ((B, T, HV, 64), torch.bfloat16): 1})
    if l2norm:
        wanted += Counter({((B, T, H), torch.float32): 2, ((B, T, H, K), torch.bfloat16): 2})
    assert found == wanted


@pytest.mark.shape_grid
@pytest.mark.parametrize(("T", "H", "HV", "K", "V", "with_state", "l2norm", "scale"), DENSE_CASES)
def test_fp32_matches_fp64_recurrence(T, H, HV, K, V, with_state, l2norm, scale, gen):
    inputs = make_inputs(gen, T, H, HV, K, V, with_state=with_state)
    check_against_recurrence(gen, inputs, TOL[torch.float32], scale=scale, l2norm=l2norm)


@pytest.mark.shape_grid
@pytest.mark.parametrize(
    ("bounds", "with_state", "l2norm"),
    [([0, 1, 65, 130], True, True), ([0, 17, 17, 90], False, False), ([0, 64, 128], True, False)],
    ids=["one-token-and-tails", "empty-sequence", "whole-chunks"],
)
def test_varlen_fp32_matches_fp64_recurrence(bounds, with_state, l2norm, gen):
    inputs = make_inputs(gen, bounds[-1], 1, 2, 64, 48, N=len(bounds) - 1, with_state=with_state)
    check_against_recurrence(gen, inputs, TOL[torch.float32], cu_seqlens=bounds, scale=0.2, l2norm=l2norm)


@pytest.mark.shape_grid
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("l2norm", [False, True])
def test_half_precision_matches_fp64_recurrence(dtype, l2norm, gen):
    inputs = make_inputs(gen, 100, 1, 2, 64, 64, dtype=dtype)
    check_against_recurrence(gen, inputs, TOL[dtype], l2norm=l2norm, tol_of=HALF_REDUCED_GRAD_TOL)


@pytest.mark.shape_grid
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("l2norm", [False, True])
def test_half_precision_without_a_final_state(dtype, l2norm, gen):
    """A training step's call: no final state, so the state backward keeps dh in the inputs' dtype."""
    inputs = make_inputs(gen, 200, 1, 2, 64, 64, dtype=dtype)
    check_against_recurrence(gen, inputs, TOL[dtype], l2norm=l2norm, tol_of=HALF_REDUCED_GRAD_TOL, final_state=False)


@pytest.mark.single_op
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_state_gradient_buffer_is_fp32_only_with_a_final_state_gradient(dtype, gen):
    """dh (one [K, V] per chunk and value head, the backward's largest buffer) is in k's dtype, and fp32
    where the final state's gradient flows into it."""
    q, k, v, g, beta, h0 = (x.to(DEVICE) for x in make_inputs(gen, 130, 1, 2, 32, 48, dtype=dtype))
    call = PREPARE["chunk_gated_delta_rule"](q, k, v, g, beta, initial_state=h0)
    plan = triton_chunk._plan(call)
    tiles, dot = config.tiles_for(32, 48, k.element_size()), triton_chunk._fp32_dot(dtype)
    gc, Ai = wy.wy_prepare(k, g, beta, 2, plan, tiles, dot)
    w, _ = wy.wy_apply(k, v, beta, gc, Ai, plan, tiles, dot)
    exact = triton_chunk._fp32_dot(torch.float32)
    do = torch.randn_like(v)
    dv = output.dv_local(q, k, gc, do, 0.3, plan, tiles, dot)
    for dht, wanted in ((None, dtype), (torch.randn_like(h0), torch.float32)):
        dh, _, _ = state.state_backward(q, k, w, gc, do, dv.clone(), dht, False, 0.3, plan, tiles, dot, exact)
        assert dh.dtype == wanted


@pytest.mark.shape_grid
def test_half_precision_varlen_with_half_gates(gen):
    """bf16 everywhere, gates included (g arrives fp32 or half; its gradient comes back in its dtype)."""
    bounds = [0, 1, 65, 130]
    inputs = make_inputs(gen, 130, 1, 2, 64, 64, N=3, dtype=torch.bfloat16, g_dtype=torch.bfloat16)
    check_against_recurrence(
        gen, inputs, TOL[torch.bfloat16], cu_seqlens=bounds, l2norm=True, tol_of=HALF_REDUCED_GRAD_TOL
    )


def split_every(monkeypatch, chunks: int) -> None:
    """Make the state passes split every sequence longer than `chunks` chunks into segments of that
    many: a device of many SMs (the interpreter counts one) and the shortest segment lowered."""
    monkeypatch.setattr(config, "processors", lambda device: 100_000)
    monkeypatch.setattr(config, "OVERRIDES", {"segment_chunks": chunks, "segment_programs": 3})


# (B or sequence bounds, T, chunks per segment, initial state, l2norm): a split with a short last
# segment, one segment per chunk, sequences at and under one segment, an empty one; K = 48 leaves the
# last 16 rows and columns of the (64-padded) map masked.
SPLIT_CASES = [
    (2, 200, 3, True, True),
    (1, 330, 1, False, False),
    ([0, 0, 70, 300, 330], 330, 2, True, True),
    ([0, 128, 129, 400], 400, 2, False, True),
]


@pytest.mark.shape_grid
@pytest.mark.parametrize(("batch", "T", "chunks", "with_state", "l2norm"), SPLIT_CASES)
def test_split_state_passes_match_fp64_recurrence(batch, T, chunks, with_state, l2norm, gen, monkeypatch):
    """Sequences split into segments whose summaries are combined (the parallel state passes of one
    long sequence): the output, the final state and every gradient, as the unsplit passes."""
    split_every(monkeypatch, chunks)
    bounds = batch if isinstance(batch, list) else None
    N = len(bounds) - 1 if bounds else batch
    inputs = make_inputs(gen, T, 1, 2, 48, 40, B=1 if bounds else batch, N=N, with_state=with_state)
    call = PREPARE["chunk_gated_delta_rule"](
        *(x.to(DEVICE) for x in inputs[:5]),
        cu_seqlens=None if bounds is None else torch.tensor(bounds, dtype=torch.int32, device=DEVICE),
    )
    split = triton_chunk._plan(call).split
    assert split is not None and split.count > N, "the sequences were not split"
    check_against_recurrence(gen, inputs, TOL[torch.float32], cu_seqlens=bounds, l2norm=l2norm)


@pytest.mark.single_op
def test_a_packed_call_under_capture_keeps_its_sequences_whole(gen, monkeypatch):
    """Where the state passes would split a packed call's sequences, the split needs the plan on the host
    (one device-to-host copy), which a CUDA graph cannot capture: during capture the call keeps its
    sequences whole, reads nothing back and gives the fp64 recurrence's answer."""
    split_every(monkeypatch, 2)
    bounds = [0, 70, 300, 330]
    inputs = make_inputs(gen, 330, 1, 2, 48, 40, N=3)
    call = PREPARE["chunk_gated_delta_rule"](
        *(x.to(DEVICE) for x in inputs[:5]), cu_seqlens=torch.tensor(bounds, dtype=torch.int32, device=DEVICE)
    )
    assert triton_chunk._plan(call).split is not None, "outside a capture the sequences split"

    def no_read_back(plan):
        raise AssertionError("a packed plan read back to the host during capture")

    monkeypatch.setattr(triton_chunk, "_capturing", lambda device: True)
    monkeypatch.setattr(triton_chunk, "read_back", no_read_back)
    assert triton_chunk._plan(call).split is None
    check_against_recurrence(gen, inputs, TOL[torch.float32], cu_seqlens=bounds, l2norm=True)


@pytest.mark.shape_grid
def test_split_forward_with_a_whole_backward(gen, monkeypatch):
    """split_backward = 0: the forward's state passes (the backward's recomputation too) split, the
    backward's reverse pass runs whole."""
    split_every(monkeypatch, 1)
    config.OVERRIDES["split_backward"] = 0
    inputs = make_inputs(gen, 200, 1, 2, 32, 48, B=2)
    check_against_recurrence(gen, inputs, TOL[torch.float32], l2norm=True)


@pytest.mark.single_op
def test_split_backward_reads_the_forward_maps_transposed(gen, monkeypatch):
    """The split backward takes each segment's map from the forward's summaries, transposed: the same dh,
    dv and initial-state gradient as when its summary kernel computes the maps itself."""
    split_every(monkeypatch, 1)
    q, k, v, g, beta, h0 = (x.to(DEVICE) for x in make_inputs(gen, 300, 1, 2, 32, 48, N=3))
    call = PREPARE["chunk_gated_delta_rule"](
        q, k, v, g, beta, initial_state=h0, cu_seqlens=torch.tensor([0, 0, 130, 300], device=DEVICE)
    )
    plan = triton_chunk._plan(call)
    assert plan.split is not None
    tiles, dot = config.tiles_for(32, 48, 4), triton_chunk._fp32_dot(torch.float32)
    gc, Ai = wy.wy_prepare(k, g, beta, 2, plan, tiles, dot)
    w, u = wy.wy_apply(k, v, beta, gc, Ai, plan, tiles, dot)
    _, _, _, maps = state.state_forward(k, w, u, gc, h0, False, plan, tiles, dot, dot)
    do, dht = torch.randn_like(v), torch.randn_like(h0)
    dv = output.dv_local(q, k, gc, do, 0.3, plan, tiles, dot)
    own, reused = (
        state.state_backward(q, k, w, gc, do, dv.clone(), dht, True, 0.3, plan, tiles, dot, dot, m)
        for m in (None, maps)
    )
    chunks = int(plan.host_offsets[0, -1])  # dh's rows past them (the grid's bound) are never written
    for name, a, b in zip(("dh", "dv", "dh0"), own, reused, strict=True):
        if name == "dh":
            a, b = a[:chunks], b[:chunks]
        assert rel_err(b, a) < 1e-5, (name, rel_err(b, a))


@pytest.mark.shape_grid
@pytest.mark.parametrize("final_state", [True, False], ids=["final-state", "no-final-state"])
def test_split_state_passes_in_half_precision(final_state, gen, monkeypatch):
    split_every(monkeypatch, 1)
    inputs = make_inputs(gen, 260, 1, 2, 64, 64, dtype=torch.bfloat16)
    check_against_recurrence(
        gen, inputs, TOL[torch.bfloat16], l2norm=True, tol_of=HALF_REDUCED_GRAD_TOL, final_state=final_state
    )


OUTPUT_CASES = [  # (sequence bounds or None for a dense batch of 2, T, chunks per segment or 0: whole)
    (None, 150, 0),
    ([0, 1, 65, 130], 130, 0),
    ([0, 1, 65, 200], 200, 1),
    (None, 200, 2),
]


@pytest.mark.single_op
@pytest.mark.parametrize(("bounds", "T", "chunks"), OUTPUT_CASES, ids=["dense", "packed", "packed-split", "split"])
def test_state_pass_writes_the_output_of_the_output_kernel(bounds, T, chunks, gen, monkeypatch):
    """The forward's state pass writing the output as it goes (`state.writes_output`, v_new formed from
    (I + A)^-1, v and beta) gives the output and final state of the state pass that stores h and v_new
    followed by the output kernel, up to bf16 roundings, dense and packed, over whole and split
    sequences; and it launches no output kernel, and no WU kernel where no split's summaries need w and u."""
    if chunks:
        split_every(monkeypatch, chunks)
    base = dict(config.OVERRIDES)
    N = 2 if bounds is None else len(bounds) - 1
    inputs = make_inputs(gen, T, 1, 2, 32, 48, B=2 if bounds is None else 1, N=N, dtype=torch.bfloat16)
    q, k, v, g, beta, h0 = (x.to(DEVICE) for x in inputs)
    cu = None if bounds is None else torch.tensor(bounds, dtype=torch.int32, device=DEVICE)
    kwargs = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, scale=0.3)
    results, launched = [], []
    for fused in (16, 0):
        monkeypatch.setattr(config, "OVERRIDES", {**base, "output_in_state_bv": fused})
        with torch.no_grad():
            results.append(triton_op(q, k, v, g, beta, **kwargs))
        launches = Launches(monkeypatch)
        with torch.no_grad():
            triton_op(q, k, v, g, beta, **kwargs)
        launched.append({kernel.fn.__name__ for kernel, *_ in launches.calls})
        monkeypatch.undo()  # the recorders out again (and the overrides)
        if chunks:
            split_every(monkeypatch, chunks)
    (o_fused, ht_fused), (o_apart, ht_apart) = results
    assert torch.isfinite(o_apart.float()).all() and o_apart.float().abs().max() > 0
    assert rel_err(o_fused, o_apart) < 1e-2, rel_err(o_fused, o_apart)
    assert rel_err(ht_fused, ht_apart) < 1e-2, rel_err(ht_fused, ht_apart)
    assert "_output_kernel" not in launched[0] and "_output_kernel" in launched[1], launched
    assert ("_wu_kernel" in launched[0]) == bool(chunks) and "_wu_kernel" in launched[1], launched
    assert ("_state_fwd_summary_kernel" in launched[0]) == bool(chunks), launched


@pytest.mark.shape_grid
@pytest.mark.parametrize("l2norm", [False, True])
def test_output_kernel_path_matches_fp64_recurrence(l2norm, gen, monkeypatch):
    """The forward that leaves the output to its own kernel (GPU slices narrower than
    tiles.output_in_state_bv; under the interpreter only where set)."""
    monkeypatch.setattr(config, "OVERRIDES", {"output_in_state_bv": 0})
    inputs = make_inputs(gen, 100, 1, 2, 64, 48, dtype=torch.bfloat16)
    check_against_recurrence(gen, inputs, TOL[torch.bfloat16], l2norm=l2norm, tol_of=HALF_REDUCED_GRAD_TOL)


@pytest.mark.single_op
def test_packed_segments_tables():
    """Segments of two chunks over sequences of 0, 70, 230 and 30 tokens: one (empty) segment, one, two
    (128 + 102 tokens), one; bounds, first chunks and each sequence's first segment."""
    cu = torch.tensor([0, 0, 70, 300, 330], device=DEVICE)
    split = split_sequences(read_back(plan_chunks(1, 330, cu, config.CHUNK, torch.device(DEVICE))), 2).split
    assert split.count == 5
    assert split.bounds.tolist() == [0, 0, 70, 198, 300, 330]
    assert split.chunk_offsets.tolist() == [0, 0, 2, 4, 6, 7]
    assert split.first.tolist() == [0, 1, 2, 4, 5]
    dense = split_sequences(plan_chunks(3, 330, None, config.CHUNK, torch.device("cpu")), 2).split
    assert (dense.count, dense.per_sequence, dense.tokens) == (9, 3, 128)


def host_plan(bounds: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed plan's tables as the host computed them before they were planned on the device:
    (chunk offsets [N + 1], (sequence, chunk within it) of every chunk [chunks, 2], the offsets)."""
    cu = torch.tensor(bounds, dtype=torch.int64)
    counts = (cu[1:] - cu[:-1] + config.CHUNK - 1) // config.CHUNK
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    sequence = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    within = torch.arange(int(offsets[-1])) - offsets[sequence]
    return offsets, torch.stack([sequence, within], dim=1), cu


# packed sequences: lengths of 1, of whole chunks, uneven tails and an empty one
PACKED_BOUNDS = [[0, 1, 65, 129, 192, 250], [0, 64, 64, 127, 128], [0, 300]]


@pytest.mark.single_op
@pytest.mark.parametrize("bounds", [*PACKED_BOUNDS, list(range(0, 70_001, 7))], ids=["uneven", "whole", "one", "10k"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_device_plan_tables_are_the_host_plans(bounds, dtype):
    """The packed plan's tables computed on the device (no host copy): the offsets, each sequence's first
    chunk and every chunk's (sequence, chunk within it) as the host plan had them, over a grid of
    T // 64 + N rows whose rows past the last chunk lie past the last sequence's end; the flag unset."""
    T, N = bounds[-1], len(bounds) - 1
    plan = plan_chunks(1, T, torch.tensor(bounds, dtype=dtype, device=DEVICE), config.CHUNK, torch.device(DEVICE))
    offsets, indices, cu = host_plan(bounds)
    chunks = int(offsets[-1])
    assert plan.num_chunks == T // config.CHUNK + N >= chunks
    assert plan.cu_seqlens.dtype == plan.chunk_offsets.dtype == plan.chunk_indices.dtype == torch.int32
    assert plan.cu_seqlens.cpu().tolist() == cu.tolist() and plan.bad_offsets.cpu().tolist() == [0]
    assert plan.chunk_offsets.cpu().tolist() == offsets.tolist()
    rows = plan.chunk_indices.cpu().long()
    assert torch.equal(rows[:chunks], indices)
    past = rows[chunks:]
    assert (past[:, 0] == N - 1).all() and (past[:, 1] * config.CHUNK >= int(cu[-1] - cu[-2])).all()
    for where in (plan.cu_seqlens, plan.chunk_offsets, plan.chunk_indices):  # 16-byte aligned for any N
        assert where.data_ptr() % 16 == 0


@pytest.mark.single_op
@pytest.mark.parametrize(
    "bounds",
    [[0, 3, 2, 7], [0, 3, 9, 7], [1, 3, 5, 7], [0, 3, 5, 6], [-5, 3, 5, 7], [0, 2**40, 5, 7]],
    ids=["decreasing", "past-the-tokens", "first-not-0", "last-not-T", "negative", "past-int32"],
)
def test_refused_offsets_plan_one_sequence_of_every_token(bounds):
    """Offsets out of order or not from 0 to T: the flag set, and the tables of sequence 0 over all T
    tokens and the others empty (every row in range, whatever the values)."""
    T = 7
    plan = plan_chunks(1, T, torch.tensor(bounds, device=DEVICE), config.CHUNK, torch.device(DEVICE))
    assert plan.bad_offsets.cpu().tolist() != [0]
    assert plan.cu_seqlens.cpu().tolist() == [0, 7, 7, 7]
    assert plan.chunk_offsets.cpu().tolist() == [0, 1, 1, 1]
    assert plan.chunk_indices.cpu().tolist()[:1] == [[0, 0]]


def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    as_int = {4: torch.int32, 2: torch.int16}[a.element_size()]
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


@pytest.mark.single_op
@pytest.mark.parametrize(
    ("bounds", "dtype", "states"),
    [
        (PACKED_BOUNDS[0], torch.float32, True),
        (PACKED_BOUNDS[1], torch.bfloat16, True),
        (PACKED_BOUNDS[1], torch.bfloat16, False),
        (PACKED_BOUNDS[0], torch.bfloat16, False),
    ],
    ids=["fp32-states", "bf16-states", "bf16", "bf16-uneven"],
)
def test_device_plan_gives_the_host_plans_answer_bit_for_bit(bounds, dtype, states, gen):
    """A packed call over the device plan (its grid an upper bound, its rows past the last chunk ended
    early) and over the host plan's tables (one row per chunk): the output, the final state and every
    gradient bit for bit equal, with and without initial and final states."""
    T, N = bounds[-1], len(bounds) - 1
    inputs = make_inputs(gen, T, 1, 2, 32, 48, N=N, dtype=dtype, with_state=states)
    cu = torch.tensor(bounds, dtype=torch.int32, device=DEVICE)
    do = torch.randn(1, T, 2, 48, generator=gen).to(DEVICE, dtype)
    dht = torch.randn(N, 2, 32, 48, generator=gen).to(DEVICE)
    device_plan = plan_chunks(1, T, cu, config.CHUNK, torch.device(DEVICE))
    offsets, indices, _ = host_plan(bounds)

    def on(device: torch.Tensor) -> torch.Tensor:
        return device.to(DEVICE, torch.int32)

    old = dataclasses.replace(
        device_plan,
        num_chunks=int(offsets[-1]),
        chunk_indices=on(indices),
        chunk_offsets=on(offsets),
        cu_seqlens=cu,
        bad_offsets=torch.zeros(1, dtype=torch.int32, device=DEVICE),
    )
    results = []
    for plan in (old, device_plan):
        leaves = [None if x is None else x.detach().clone().to(DEVICE).requires_grad_() for x in inputs]
        call = PREPARE["chunk_gated_delta_rule"](
            *leaves[:5], initial_state=leaves[5], output_final_state=states, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
        )
        o, final = triton_chunk.ChunkGatedDeltaRuleFunction.apply(*triton_chunk._arguments(call, plan))
        loss = (o.float() * do.float()).sum() + (final * dht).sum() if states else (o.float() * do.float()).sum()
        loss.backward()
        results.append([o, final, *(None if x is None else x.grad for x in leaves)])
    for name, a, b in zip(("o", "final_state", *GRAD_NAMES), *results, strict=True):
        assert same_bits(a, b), name


@pytest.mark.single_op
def test_a_dense_batch_and_its_sequences_packed_agree_bit_for_bit(gen):
    """Two sequences of 130 tokens as a dense batch (arithmetic plan) and packed (the device plan):
    the same output, final state and gradients, bit for bit."""
    q, k, v, g, beta, h0 = make_inputs(gen, 130, 1, 2, 32, 48, B=2, dtype=torch.bfloat16)
    cu = torch.tensor([0, 130, 260], dtype=torch.int32, device=DEVICE)
    results = []
    for packed in (False, True):
        xs = [x.flatten(0, 1).unsqueeze(0) if packed else x for x in (q, k, v, g, beta)]
        leaves = [x.detach().clone().to(DEVICE).requires_grad_() for x in (*xs, h0)]
        o, final = triton_op(
            *leaves[:5],
            initial_state=leaves[5],
            output_final_state=True,
            cu_seqlens=cu if packed else None,
            use_qk_l2norm_in_kernel=True,
        )
        (o.float().sum() + final.sum()).backward()
        grads = [x.grad.reshape_as(y) for x, y in zip(leaves, (q, k, v, g, beta, h0), strict=True)]
        results.append([o.reshape(2, 130, 2, 48), final, *grads])
    for name, a, b in zip(("o", "final_state", *GRAD_NAMES), *results, strict=True):
        assert same_bits(a, b), name


@pytest.mark.single_op
@pytest.mark.parametrize(
    "bounds", [[0, 30, 20, 90], [0, 30, 95, 90], [0, 30, 60, 80]], ids=["decreasing", "past", "short"]
)
def test_refused_offsets_give_nan_and_are_read_nowhere_on_the_host(bounds, gen, monkeypatch):
    """The public chunk op on the triton backend with bad cu_seqlens: no host read of the offsets (the
    kernels check them), and every output, final state and gradient NaN; GDN_VALUE_CHECKS=1 runs the
    host check, which names the entry."""
    import gdn
    from gdn import _validate
    from gdn.resolve import compute_mode_override

    T, N = 90, len(bounds) - 1
    inputs = make_inputs(gen, T, 1, 2, 32, 48, N=N)
    host_reads = []
    original = _validate.Checker._offset_values
    monkeypatch.setattr(
        _validate.Checker, "_offset_values", lambda self, *a: host_reads.append(a[0]) or original(self, *a)
    )
    with compute_mode_override("triton"):
        good = torch.tensor([0, 30, 60, 90], dtype=torch.int32, device=DEVICE)
        leaves = [x.to(DEVICE).requires_grad_() for x in inputs]
        gdn.chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=good)
        host_reads.clear()  # the resolution's numeric probe validated its own calls
        cu = torch.tensor(bounds, dtype=torch.int32, device=DEVICE)
        o, final = gdn.chunk_gated_delta_rule(
            *leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu
        )
        (o.sum() + final.sum()).backward()
        assert host_reads == []
        assert o.isnan().all() and final.isnan().all()
        for name, leaf in zip(GRAD_NAMES, leaves, strict=True):
            assert leaf.grad.isnan().all(), name
        monkeypatch.setenv("GDN_VALUE_CHECKS", "1")
        with pytest.raises(ValueError, match="cu_seqlens"):
            gdn.chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu)


@pytest.mark.single_op
def test_state_slices_and_splits_follow_the_idle_sms(monkeypatch):
    """On a 132-SM device with 128-wide values: 64-wide slices where they fill it, 32-wide where those
    cover three quarters of it (one sequence of 32 heads), 16-wide below (16 heads), and splitting
    where 32-wide slices would leave more than five eighths idle (12 heads and fewer; a sequence too
    short to split keeps the split's slice), in 64-wide slices where WALK segments of one sequence
    give seven eighths of a program per SM (4 heads and more) and 32-wide below (2 heads): segments
    for about two programs per SM, at most WALK a sequence, never under the shortest segment, none for
    a sequence within one segment or where K is over 128, and none with segment_programs = 0 (16-wide
    slices then)."""
    monkeypatch.setattr(config, "processors", lambda device: 132)
    # the GPU's slices, also under the interpreter
    monkeypatch.setattr(config, "OVERRIDES", {"state_bv": 64, "state_bv_short": 32, "state_bv_narrow": 16})
    tiles, cpu = config.tiles_for(128, 128, 2), torch.device("cpu")
    assert [config.state_slice(tiles, n, n, 128, cpu) for n in (128, 66, 64, 32, 25, 24, 13, 12, 4)] == [
        *(64, 64, 32, 32, 32),
        *(16, 16, 64, 64),
    ]
    assert [config.split_slice(tiles, n, 128, cpu) for n in (12, 8, 4, 3, 2)] == [64, 64, 64, 32, 32]
    # three sequences of 2 heads split in the slice of one (a class's calls share their binaries)
    assert config.state_slice(tiles, 6, 2, 128, cpu) == 32
    assert [config.could_split(tiles, n, 128, cpu) for n in (32, 16, 13, 12, 8, 4)] == [False] * 3 + [True] * 3
    assert config.segment_length(tiles, 8, 8, 128, 128, cpu) == 8  # 16 segments: 256 programs
    assert config.segment_length(tiles, 4, 4, 128, 512, cpu) == 32  # 16 segments (WALK): 128 programs
    assert config.segment_length(tiles, 2, 2, 128, 512, cpu) == 32  # 16 segments of 32 columns: 128
    assert config.segment_length(tiles, 8, 8, 128, 20, cpu) == tiles.segment_chunks
    assert config.segment_length(tiles, 8, 8, 128, tiles.segment_chunks, cpu) == 0
    assert config.segment_length(tiles, 16, 16, 128, 512, cpu) == 0
    off = dataclasses.replace(tiles, segment_programs=0)
    assert config.segment_length(off, 4, 4, 128, 512, cpu) == 0 and not config.could_split(off, 4, 128, cpu)
    assert config.state_slice(off, 4, 4, 128, cpu) == 16
    wide = config.tiles_for(256, 128, 2)  # the combine's 256 x 256 map would not fit shared memory
    assert config.segment_length(wide, 4, 4, 128, 512, cpu) == 0 and not config.could_split(wide, 4, 128, cpu)


STATE_SCENARIO = """
import dataclasses

from gdn.backends.triton import chunk, l2norm
from gdn.backends.triton.common import config, output, qk_grads, state, wy, wy_bwd
from gdn.calls import PREPARE

config.processors = lambda device: 132  # an H200's SMs: one sequence of 8 heads splits
chunk._gpu_fp32_precision = lambda: "tf32x3"  # what a CUDA target answers (no driver here)
kernels = {n: f for n, f in vars(state).items() if isinstance(f, JITFunction) and n.endswith("_kernel")}
for m in (wy, wy_bwd, output, qk_grads, l2norm):  # only the state kernels compile here
    for name, f in list(vars(m).items()):
        if isinstance(f, JITFunction) and name.endswith("_kernel"):
            setattr(m, name, Recorder())


def usage(K, V, H, HV, dtype):
    # one sequence of 8192 tokens with an initial and a final state, forward and backward, split or not
    for name in kernels:
        setattr(state, name, Recorder())
    q, k = (torch.randn(1, 8192, H, K, dtype=dtype) for _ in range(2))
    v, beta = torch.randn(1, 8192, HV, V, dtype=dtype), torch.rand(1, 8192, HV, dtype=dtype)
    h0 = torch.zeros(1, HV, K, V)
    g = -torch.rand(1, 8192, HV)
    call = PREPARE["chunk_gated_delta_rule"](q, k, v, g, beta, initial_state=h0, output_final_state=True)
    plan = chunk._plan(call)
    for plan in [plan] if plan.split is None else [plan, dataclasses.replace(plan, split=None)]:
        with torch.no_grad():
            o, final, kept, saved = chunk._forward(*chunk._arguments(call, plan))
            chunk._backward(kept, saved, torch.empty_like(o), torch.empty_like(final), True)
    found = {}
    for name, f in kernels.items():
        for args, kwargs in getattr(state, name).launches:
            found.setdefault(name, {})[launch_key((f, args, kwargs))] = compile_sm90((f, args, kwargs))
    return found


def ptx_of(launch):  # its sm_90 PTX
    signature, constexprs, attrs, options = specialize(*launch)
    source = ASTSource(launch[0], signature, constexprs=constexprs, attrs=attrs)
    return compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def async_copy_bytes(launch):  # the byte count of every global-to-shared async copy
    return [int(n, 16) for n in re.findall(r"cp\\.async\\.\\w+\\.shared\\.global[^;]*, (0x[0-9a-f]+)", ptx_of(launch))]


def unpredicated_stores(launch):  # global stores that no predicate guards
    return len(re.findall(r"^\\s*st\\.global", ptx_of(launch), re.M))


def waits_before_storing(launch):  # the loop waits for its loads before its first store of the state
    ptx = ptx_of(launch)
    return ptx.index("cp.async.wait_group") < re.search(r"^\\s*(@%p\\d+\\s+)?st\\.global", ptx, re.M).start()


def widened(launch):  # bf16 -> fp32 conversions (one a thread and element)
    return len(re.findall(r"cvt\\.f32\\.bf16", ptx_of(launch)))


def storing_h(name):  # the first launch of a state pass that stores the state per chunk (h or dh)
    return next((args, kwargs) for args, kwargs in getattr(state, name).launches if not kwargs.get("OUTPUT"))


RESULT["bf16 K=128"] = usage(128, 128, 4, 8, torch.bfloat16)
RESULT["output in the forward"] = sorted({kwargs["OUTPUT"] for _, kwargs in state._state_fwd_kernel.launches})
RESULT["waits before storing"] = {
    f"{name} BV={BV}": waits_before_storing((kernels[name], args, dict(kwargs, BV=BV)))
    for name in ("_state_fwd_kernel", "_state_bwd_kernel")
    for args, kwargs in [storing_h(name)]
    for BV in (32, 64)
}
for args, kwargs in state._state_bwd_kernel.launches[:1]:
    RESULT["backward widened"] = widened((kernels["_state_bwd_kernel"], args, dict(kwargs, BV=32, num_warps=4)))
RESULT["unpredicated stores"] = {
    name: unpredicated_stores((kernels[name], *storing_h(name))) for name in ("_state_fwd_kernel", "_state_bwd_kernel")
}
combines = state._state_combine_kernel.launches  # still the recorder of the call above
RESULT["combine copies"] = sorted(
    {tuple(sorted(set(async_copy_bytes((kernels["_state_combine_kernel"], a, kw))))) for a, kw in combines}
)
RESULT["bf16 K=256"] = usage(256, 256, 16, 16, torch.bfloat16)
RESULT["fp32 K=256"] = usage(256, 256, 16, 16, torch.float32)
"""
# an H200 SM's shared memory for one block (cudaDevAttrMaxSharedMemoryPerBlockOptin)
H200_SHARED_BYTES = 232_448


@pytest.mark.single_op
def test_state_kernels_compile_for_hopper():
    """The state passes through the NVIDIA compiler for sm_90 (the interpreter accepts some programs the
    compiler rejects, and knows no shared-memory limit): one sequence of 8192 tokens, bf16 with 8 heads
    of 128 x 128 (split and whole), bf16 and fp32 with 16 heads of 256 x 256 (never split). One binary
    per kernel but the combine's two (the forward's maps read by rows, the backward's transposed: their
    strides are constants, so that both read 16 bytes at a time), every one within an H200 SM's shared
    memory, and no spills at K = 128 but the combine's few bytes: it holds a whole K x K fp32 map, which
    tf32x3 splits in registers (16 bytes of spills at 2 stages), and on the H200 that walk took 0.175 ms
    at 4 value heads against 0.253 for products in 32-column slices against a seed read back, which did
    not spill."""
    result = run_on_hopper_compiler(STATE_SCENARIO)
    # the combine's map, seed and summary reads are 16-byte copies (4-byte ones while the map's strides
    # were runtime values: 48 of them a thread and step)
    assert result.pop("combine copies") == [[16]]
    # the per-chunk state (h forward, dh backward) stored without a predicate where the slices tile the
    # state exactly: bounded by the program's V slice, every store was predicated and kept apart from
    # the chunk's products (both passes about 1-3% slower on the H200)
    # the backward widens to fp32 only its two [64, BV] tiles (do, scaled by each row's gate, and the local
    # dv): 2 x 64 x 32 / 128 threads at 32 columns over 4 warps. Scaling q's [128, 64] tile instead cost
    # 48 more a thread and a third of the loop's instructions (the pass 0.30 -> 0.21 ms on the H200)
    assert result.pop("backward widened") == 32
    unguarded = result.pop("unpredicated stores")
    assert all(count > 0 for count in unguarded.values()), unguarded
    # where the pipelined loop waits for a chunk's loads: before the state's store (the gates loaded
    # first) in the backward and in the forward's 32-column slices, after it in the forward's 64-column
    # ones, as measured fastest on the H200 (the forward at 32 columns 12% slower the other way)
    assert result.pop("waits before storing") == {
        "_state_fwd_kernel BV=32": True,
        "_state_fwd_kernel BV=64": False,
        "_state_bwd_kernel BV=32": True,
        "_state_bwd_kernel BV=64": True,
    }
    # at K = 128 the forward's pass writes the output (64-column slices) and the backward's recomputes
    # h: two binaries; at K = 256 the output's tiles would not fit beside the pass's, so one
    assert result.pop("output in the forward") == [0, 1]
    split = {"_state_fwd_summary_kernel", "_state_bwd_summary_kernel", "_state_combine_kernel"}
    plain = {"_state_fwd_kernel", "_state_bwd_kernel"}
    assert set(result["bf16 K=128"]) == plain | split
    assert set(result["bf16 K=256"]) == set(result["fp32 K=256"]) == plain
    for case, usage in result.items():
        binaries = {name: len(found) for name, found in usage.items()}
        two = {"_state_combine_kernel"} | ({"_state_fwd_kernel"} if case == "bf16 K=128" else set())
        assert binaries == {name: 2 if name in two else 1 for name in usage}, (case, binaries)
        over = {name: u["shared"] for name, b in usage.items() for u in b.values() if u["shared"] > H200_SHARED_BYTES}
        assert not over, f"{case}: asks for more shared memory than an H200 SM has: {over}"
    # the forward writing the output spills (ptxas, sm_90): 32 bytes with Triton 3.6, whose binaries the
    # H200 timed (most stored before its chunk loop and loaded after it for the final state's store, two
    # 4-byte reloads a chunk inside it), 92 with Triton 3.9 (not timed on a GPU)
    allowed = {"_state_combine_kernel": 16, "_state_fwd_kernel": 96}
    spills = {
        n: u for n, b in result["bf16 K=128"].items() for u in b.values() if (u["spill_bytes"] or 0) > allowed.get(n, 0)
    }
    assert not spills, spills


STAGES_SCENARIO = """
from gdn.backends.triton import chunk, l2norm
from gdn.backends.triton.common import config, output, qk_grads, state, wy, wy_bwd
from gdn.calls import PREPARE

chunk._gpu_fp32_precision = lambda: "tf32x3"  # what a CUDA target answers (no driver here)
for name, f in list(vars(state).items()):  # the state passes have a test of their own
    if isinstance(f, JITFunction) and name.endswith("_kernel"):
        setattr(state, name, Recorder())
modules = (wy, wy_bwd, output, qk_grads, l2norm)
kernels = {
    (m, n): f for m in modules for n, f in vars(m).items() if isinstance(f, JITFunction) and n.endswith("_kernel")
}


def usage(dtype, final_state):
    # one sequence of 256 tokens, 2 heads of 128 x 128 over 4 value heads, forward and backward
    for m, name in kernels:
        setattr(m, name, Recorder())
    q, k = (torch.randn(1, 256, 2, 128, dtype=dtype) for _ in range(2))
    v, beta = torch.randn(1, 256, 4, 128, dtype=dtype), torch.rand(1, 256, 4, dtype=dtype)
    g = -torch.rand(1, 256, 4)
    call = PREPARE["chunk_gated_delta_rule"](
        q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=final_state
    )
    with torch.no_grad():
        o, final, kept, saved = chunk._forward(*chunk._arguments(call, chunk._plan(call)))
        dht = torch.empty_like(final) if final_state else None
        chunk._backward(kept, saved, torch.empty_like(o), dht, True)
        config.OVERRIDES["output_in_state_bv"] = 0  # the forward with its output kernel too
        chunk._forward(*chunk._arguments(call, chunk._plan(call)))
        config.OVERRIDES.clear()
    found = {}
    for (m, name), f in kernels.items():
        for args, kwargs in getattr(m, name).launches:
            found.setdefault(name, {})[launch_key((f, args, kwargs))] = compile_sm90((f, args, kwargs))
    return found


RESULT["bf16"] = usage(torch.bfloat16, False)
RESULT["bf16, final state"] = usage(torch.bfloat16, True)  # dh in fp32
RESULT["fp32, final state"] = usage(torch.float32, True)
"""


@pytest.mark.single_op
def test_stage_kernels_fit_hopper():
    """The chunk op's other stages (WY forward and backward, output, qk_grads, l2norm) through the
    NVIDIA compiler for sm_90 at K = V = 128: bf16 with dh in bf16 and in fp32, and fp32 throughout.
    Every binary fits an H200 SM's shared memory (the interpreter knows no limit: a qk_grads over the
    whole K of fp32 inputs asked for 245,760 bytes and failed at launch on the H200)."""
    result = run_on_hopper_compiler(STAGES_SCENARIO)
    for case, usage in result.items():
        assert {"_qk_grads_kernel", "_wy_bwd_kernel", "_output_kernel"} <= set(usage), case
        over = {name: u["shared"] for name, b in usage.items() for u in b.values() if u["shared"] > H200_SHARED_BYTES}
        assert not over, f"{case}: asks for more shared memory than an H200 SM has: {over}"


@pytest.mark.single_op
def test_narrow_tiles_agree(gen, monkeypatch):
    """Several K and V slices per program (the GPU tiling, narrower): partial sums over K slices,
    V-sliced state passes and masks inside every slice; the WY backward's dq and dk in K slices, so the
    l2norm's backward runs apart (`l2norm_bwd`), as at K > 128."""
    narrow = dict(BK=16, BV=16, state_bv=16, state_bv_short=16, output_bv=32, wy_bwd_bk=16, wy_bwd_out_bk=16)
    monkeypatch.setattr(config, "OVERRIDES", narrow)
    assert config.tiles_for(40, 40, 4).BK == 16
    inputs = make_inputs(gen, 80, 1, 2, 40, 40, N=2)
    check_against_recurrence(gen, inputs, TOL[torch.float32], cu_seqlens=[0, 10, 80], l2norm=True)


@pytest.mark.single_op
def test_strong_gates_stay_finite(gen):
    """Cumulative log decays far past exp's range, and exact zeros: no NaN or Inf anywhere, and still
    the recurrence's result.

    The kernels form the decay between two tokens of a chunk as a difference of chunk-local cumulative
    gates (as fla does), which keeps only G's absolute precision: with G in the thousands, a decay near
    1 is off by about eps * |G| relative (eager sums the segment instead). That bound is the tolerance
    here, about 7e-4 for these gates. Measured worst gradient (dg): 6.6e-5 over 20 random cases under the
    interpreter (exact fp32 dots), median 3.7e-5 and max 3.2e-4 over 200 on the H200 (tf32x3); eager 3e-7."""
    q, k, v, _, beta, h0 = make_inputs(gen, 100, 1, 2, 32, 32)
    g = -torch.rand(1, 100, 2, generator=gen) * 200.0
    g[:, ::7] = 0.0
    largest_G = max(g[:, s : s + config.CHUNK].cumsum(1).abs().max().item() for s in range(0, 100, config.CHUNK))
    tol = max(TOL[torch.float32], torch.finfo(torch.float32).eps * largest_G)
    assert tol < 1e-3  # still a test of the result: a missing or wrong term is off by O(1)
    check_against_recurrence(gen, (q, k, v, g, beta, h0), tol, l2norm=True)


@pytest.mark.single_op
def test_no_final_state_unless_asked(gen):
    q, k, v, g, beta, _ = make_inputs(gen, 10, 1, 1, 16, 16, with_state=False)
    o, final = triton_op(*(x.to(DEVICE) for x in (q, k, v, g, beta)))
    assert final is None and o.shape == v.shape and o.dtype == v.dtype


@pytest.mark.single_op
def test_unknown_knob_is_an_error(monkeypatch):
    monkeypatch.setattr(config, "OVERRIDES", {"state_BV": 32})
    with pytest.raises(KeyError, match="state_BV"):
        config.tiles_for(64, 64, 4)


class Launches:
    """Every launch of the chunk and l2norm kernels: (kernel, grid, args, kwargs, warm-up only). Under
    the interpreter the kernels are not run (only what is launched is of interest, and tensors stay
    unwritten), but for the packed plan's table kernels, whose tables a split reads back.

    A recorder stands in for each kernel in its module and catches `kernel[grid](...)` itself: patching
    the kernel's `run` misses the launches of Triton 3.2's interpreter, whose `[grid]` bypasses `run`."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[object, tuple, tuple, dict, bool]] = []
        for module in KERNEL_MODULES:
            for name, kernel in list(vars(module).items()):
                if name.startswith("_") and name.endswith("_kernel"):
                    monkeypatch.setattr(module, name, _Recorder(kernel, self.calls))


class _Recorder:
    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((self.kernel, grid, args, kwargs, False))
            # the plan's tables are run under the interpreter too: a split reads them back
            if is_interpreting() and self.kernel.fn.__name__ not in TABLE_KERNELS:
                return None
            return self.kernel[grid](*args, **kwargs)

        return launch

    def warmup(self, *args, grid, **kwargs):
        self.calls.append((self.kernel, grid, args, kwargs, True))
        return None if is_interpreting() else self.kernel.warmup(*args, grid=grid, **kwargs)


def run_op(T, cu_seqlens=None, N=1):
    """One forward and backward at length T (all options on, so that every kernel launches)."""
    gen = torch.Generator().manual_seed(0)
    inputs = make_inputs(gen, T, 1, 2, 16, 16, N=N, dtype=torch.bfloat16)
    leaves = [x.to(DEVICE).requires_grad_() for x in inputs]
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32, device=DEVICE)
    o, final = triton_op(
        *leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
    )
    (o.float().sum() + final.sum()).backward()


def specialization_key(kernel, args, kwargs) -> str:
    """The cache key Triton's launcher computes for these arguments (3.2, 3.6 and 3.9 share
    create_function_from_signature; a CUDA target stands in for the device the interpreter lacks)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    options = getattr(kernel, "kwargs", None) or kernel.rewriter.kwargs  # 3.2 keeps them on the rewriter
    jit = JITFunction(kernel.fn, do_not_specialize=options["do_not_specialize"])
    binder = create_function_from_signature(jit.signature, jit.params, make_backend(GPUTarget("cuda", 90, 32)))
    bound = binder(*args, **kwargs)
    if len(bound) == 5:  # Triton 3.2: (args, signature and specialization, constexprs, values, options)
        return "".join(bound[1]) + str((bound[2], bound[4]))
    return str(bound[1]) + str(bound[2])


LENGTHS = (4096, 4100, 4104, 4160, 5000)


@pytest.mark.single_op
@pytest.mark.skipif(not is_interpreting(), reason="the interpreter variant; CUDA counts compiled binaries")
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_one_specialization_per_kernel_across_lengths(monkeypatch, split):
    """Lengths in every divisibility class by 16, dense and packed, with the state passes over whole
    sequences and split into segments: each kernel's launches must all map to one compiled binary (T
    and the segments' sizes are not specialized, and no argument is derived from them)."""
    if split:
        split_every(monkeypatch, 8)
    launches = Launches(monkeypatch)
    keys: dict[int, dict[str, set[str]]] = {}
    for T in LENGTHS:
        launches.calls.clear()
        run_op(T)
        run_op(T, cu_seqlens=[0, 1, T // 2, T], N=3)
        for kernel, _, args, kwargs, _ in launches.calls:
            keys.setdefault(T, {}).setdefault(kernel.fn.__name__, set()).add(specialization_key(kernel, args, kwargs))
    first = keys[LENGTHS[0]]
    # the interpreter's tiles write the output in the forward's state pass: no output kernel; the packed
    # calls' two table kernels
    assert len([name for name in first if "l2norm" not in name]) == (12 if split else 9)
    for T in LENGTHS[1:]:
        differ = {name for name in first if keys[T][name] != first[name]}
        assert not differ, f"kernels specialized differently at T={T} than at T={LENGTHS[0]}: {sorted(differ)}"


@pytest.mark.single_op
@pytest.mark.skipif(not is_interpreting(), reason="the interpreter variant; CUDA counts compiled binaries")
def test_the_table_kernels_specialize_alike_across_sequence_counts(monkeypatch):
    """The packed plan's kernels take the number of sequences and the grid's rows at runtime: one
    binary each for any N and T (per offsets dtype)."""
    launches = Launches(monkeypatch)
    keys: dict[str, set[str]] = {}
    for N, T in ((1, 1), (2, 64), (3, 200), (17, 4100), (1000, 5000)):
        bounds = torch.linspace(0, T, N + 1).long().tolist()
        plan_chunks(1, T, torch.tensor(bounds, dtype=torch.int32, device=DEVICE), config.CHUNK, torch.device(DEVICE))
    for kernel, _, args, kwargs, _ in launches.calls:
        keys.setdefault(kernel.fn.__name__, set()).add(specialization_key(kernel, args, kwargs))
    assert {name: len(found) for name, found in keys.items()} == dict.fromkeys(TABLE_KERNELS, 1)


@pytest.mark.single_op
@pytest.mark.skipif(not is_interpreting(), reason="the interpreter variant; CUDA counts compiled binaries")
def test_a_dense_and_a_packed_call_launch_the_same_binaries(monkeypatch, gen):
    """Whether the sequences are packed is a runtime flag: two sequences of 70 tokens as a dense batch
    and as a packed one launch the same kernels with the same specializations (the numeric probe's
    packed cases then compile nothing that a dense call of the same class does not use)."""
    launches = Launches(monkeypatch)
    q, k, v, g, beta, h0 = make_inputs(gen, 70, 1, 2, 16, 16, B=2, dtype=torch.bfloat16)
    packed = [x.flatten(0, 1).unsqueeze(0) for x in (q, k, v, g, beta)]
    cu = torch.tensor([0, 70, 140], dtype=torch.int32, device=DEVICE)
    keys = []
    for inputs, cu_seqlens in (((q, k, v, g, beta), None), (packed, cu)):
        launches.calls.clear()
        leaves = [x.to(DEVICE).requires_grad_() for x in (*inputs, h0)]
        o, final = triton_op(
            *leaves[:5],
            initial_state=leaves[5],
            output_final_state=True,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=True,
        )
        (o.float().sum() + final.sum()).backward()
        keys.append({(k.fn.__name__, specialization_key(k, a, kw)) for k, _, a, kw, _ in launches.calls})
    dense, packed_keys = keys
    names = {name for name, _ in dense}
    # eight kernels: at K <= 128 the l2norm's backward runs inside the WY backward, and the forward's
    # state pass writes the output (the interpreter's slices: every one)
    assert len(names) == 8 and "_l2norm_bwd_kernel" not in names, sorted(names)
    # the packed call plans its chunks on the device: the table kernels besides
    assert {name for name, _ in packed_keys} - names == TABLE_KERNELS
    apart = sorted({name for name, _ in dense ^ packed_keys} - TABLE_KERNELS)
    assert not apart, f"a dense and a packed call launch different binaries of {apart}"


@pytest.mark.single_op
def test_narrow_slices_launch_at_most_four_warps(monkeypatch):
    """With 16-wide slices, 8 warps made qk_grads fault and the WY backward return wrong fp32 gradients
    on the H200: those launches are capped at 4, while slices of 32 or more keep the configured 8."""
    narrow = dict(BK=16, BV=16, wy_bwd_bk=16, qk_grads_bk=16, dqkwg_warps=8, wy_bwd_warps=8)
    monkeypatch.setattr(config, "OVERRIDES", narrow)
    launches = Launches(monkeypatch)
    run_op(70)
    warps = {kernel.fn.__name__: kwargs["num_warps"] for kernel, _, _, kwargs, _ in launches.calls}
    assert warps["_qk_grads_kernel"] == 4 and warps["_wy_bwd_kernel"] == 4, warps
    assert config.narrow_slice_warps(8, 32, 64) == 8


@pytest.mark.single_op
@pytest.mark.parametrize("final_state", [False, True])
def test_qk_grads_runs_per_value_head_over_the_whole_key(final_state, gen, monkeypatch):
    """qk_grads takes one value head a program and, up to K = 128, the whole K in one slice (its dq and
    dk per value head, summed over the group by the WY backward); a call that outputs its final state
    (fp32 dh: two half dots a product) takes 64-column slices."""
    launches = Launches(monkeypatch)
    inputs = make_inputs(gen, 70, 2, 4, 128, 32, dtype=torch.bfloat16, with_state=False)
    leaves = [x.to(DEVICE).requires_grad_() for x in inputs[:5]]
    o, final = triton_op(*leaves, output_final_state=final_state)
    (o.float().sum() + (final.sum() if final_state else 0)).backward()
    (grid, kwargs) = next((g, kw) for kern, g, _, kw, _ in launches.calls if kern.fn.__name__ == "_qk_grads_kernel")
    bk = 64 if final_state else 128
    assert kwargs["BK"] == bk and grid[1:] == (128 // bk, 4), (grid, kwargs["BK"])


@pytest.mark.single_op
@pytest.mark.parametrize("final_state", [False, True])
def test_qk_grads_writes_over_what_only_it_reads(final_state, gen, monkeypatch):
    """At K = V = 128 in a training call (bf16 dh, the whole K in one program) qk_grads writes dq's and
    dk's per-value-head parts over dh and dw over v_new (the backward's peak is there: three [T, HV, K]
    tensors fewer); with a final state (fp32 dh in two K slices, each slice's program reading the whole
    chunk of v_new) it writes them apart. The gradients are the fp64 recurrence's either way (packed, so
    the chunks' blocks have padded rows too)."""
    seen = {}
    qk_grads = triton_chunk.qk_grads

    def spying_qk_grads(q, k, v_new, h, dh, *rest):
        parts, dw, dG = qk_grads(q, k, v_new, h, dh, *rest)
        seen["parts over dh"] = parts.untyped_storage().data_ptr() == dh.untyped_storage().data_ptr()
        seen["dw over v_new"] = dw.data_ptr() == v_new.data_ptr()
        return parts, dw, dG

    monkeypatch.setattr(triton_chunk, "qk_grads", spying_qk_grads)
    inputs = make_inputs(gen, 150, 1, 2, 128, 128, N=2, dtype=torch.bfloat16)
    tol = dict(tol=TOL[torch.bfloat16], tol_of=HALF_REDUCED_GRAD_TOL)
    check_against_recurrence(gen, inputs, cu_seqlens=[0, 90, 150], l2norm=True, final_state=final_state, **tol)
    assert seen == {"parts over dh": not final_state, "dw over v_new": not final_state}


def compiled_binaries(kernel) -> int:
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:  # Triton >= 3.3: device -> (kernel cache, key cache, target, backend, binder)
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(cache) for cache in kernel.cache.values())  # Triton 3.2: device -> {key: kernel}


@pytest.mark.single_op
@pytest.mark.skipif(is_interpreting(), reason="needs compiled kernels (a CUDA device)")
def test_one_compiled_binary_per_kernel_across_lengths():
    kernels = [k for m in KERNEL_MODULES for n, k in vars(m).items() if n.startswith("_") and n.endswith("_kernel")]
    run_op(LENGTHS[0])
    before = {k: compiled_binaries(k) for k in kernels}
    for T in LENGTHS[1:]:
        run_op(T)
    grew = {k.fn.__name__: compiled_binaries(k) - n for k, n in before.items() if compiled_binaries(k) != n}
    assert not grew, f"new binaries compiled for new sequence lengths: {grew}"


def prepared_call(gen, T, H, HV, K, V, cu_seqlens, dtype=torch.bfloat16):
    """A validated call with every option on (initial state with gradient, final state, l2norm, varlen)."""
    N = len(cu_seqlens) - 1
    leaves = [x.to(DEVICE).requires_grad_() for x in make_inputs(gen, T, H, HV, K, V, N=N, dtype=dtype)]
    cu = torch.tensor(cu_seqlens, dtype=torch.int32, device=DEVICE)
    call = PREPARE["chunk_gated_delta_rule"](
        *leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
    )
    return call


@pytest.mark.single_op
@pytest.mark.skipif(not is_interpreting(), reason="the interpreter variant; CUDA counts compiled binaries")
def test_dry_run_warms_what_the_call_launches(monkeypatch, gen):
    """Compiling ahead warms up, launch by launch, the binaries a forward+backward then launches: the
    same kernels, grids and specializations in the same order (after the table kernels' warm-ups for
    int32 and int64 offsets), and runs none of them."""
    launches = Launches(monkeypatch)
    call = prepared_call(gen, 150, 2, 4, 32, 48, [0, 70, 150])
    compile_ahead.dry_run(lambda: triton_chunk._dry_step(call, needs_grad=True))
    assert all(warm for *_, warm in launches.calls)
    dry = [(k.fn.__name__, grid, specialization_key(k, a, kw)) for k, grid, a, kw, _ in launches.calls]
    launches.calls.clear()
    o, final = triton_chunk.chunk_gated_delta_rule(call)
    (o.float().sum() + final.sum()).backward()
    real = [(k.fn.__name__, grid, specialization_key(k, a, kw)) for k, grid, a, kw, warm in launches.calls if not warm]
    # the plan's 2 launches, 4 forward (the state pass forms v_new from (I + A)^-1 and writes o), 6 backward
    assert len(real) == 12 and dry[4:] == real
    assert {(name, key) for name, _, key in dry[:4]} >= {(name, key) for name, _, key in real[:2]}
    assert [name for name, *_ in dry[:4]] == ["_offsets_kernel", "_chunk_rows_kernel"] * 2


@pytest.mark.single_op
def test_a_batch_dry_runs_every_call_of_a_class(monkeypatch, gen):
    """Calls of one kernel class handed over together (the numeric probe's dense and packed cases) are
    each dry-run, in the class's one entry of the batch: on the H200 a dense case whose class had been
    dry-run only through its packed case compiled binaries at its launches, and this interpreter's
    specializations do not show which."""
    dense = prepared_call(gen, 80, 2, 4, 32, 48, [0, 80])
    packed = prepared_call(gen, 130, 2, 4, 32, 48, [0, 17, 17, 90, 130])
    dense = dataclasses.replace(dense, cu_seqlens=None)
    assert triton_chunk._dry_run_of(dense)[0] == triton_chunk._dry_run_of(packed)[0]
    batches, stepped = [], []
    monkeypatch.setattr(triton_chunk, "compile_ahead", lambda dry_runs, meanwhile: batches.append(dry_runs))
    monkeypatch.setattr(triton_chunk, "_dry_step", lambda call, needs_grad: stepped.append(call))
    triton_chunk.compile_calls_ahead([dense, packed])
    (batch,) = batches
    assert len(batch) == 1
    for run in batch.values():
        run()
    assert [call.cu_seqlens is None for call in stepped] == [True, False]


@pytest.mark.single_op
@pytest.mark.skipif(not is_interpreting(), reason="the interpreter variant; CUDA counts compiled binaries")
def test_dry_run_of_a_class_that_can_split_warms_whole_and_split_passes(monkeypatch, gen):
    """Where the state passes of the class could split a sequence, the first call's dry run warms the
    passes with and without the split: a short call and a long one of the class then launch nothing
    it did not warm."""
    split_every(monkeypatch, 1)
    launches = Launches(monkeypatch)
    short = prepared_call(gen, 60, 2, 4, 32, 48, [0, 60])
    long = prepared_call(gen, 300, 2, 4, 32, 48, [0, 100, 300])
    assert triton_chunk._plan(short).split is None and triton_chunk._plan(long).split is not None
    compile_ahead.dry_run(triton_chunk._dry_run_of(short)[1])
    warmed = {(k.fn.__name__, specialization_key(k, a, kw)) for k, _, a, kw, _ in launches.calls}
    launches.calls.clear()
    for call in (short, long):
        o, final = triton_chunk.chunk_gated_delta_rule(call)
        (o.float().sum() + final.sum()).backward()
    launched = {(k.fn.__name__, specialization_key(k, a, kw)) for k, _, a, kw, _ in launches.calls}
    assert {"_state_fwd_summary_kernel", "_state_bwd_summary_kernel", "_state_combine_kernel"} <= {
        name for name, _ in launched
    }
    assert launched <= warmed, f"launched, not warmed: {sorted(name for name, _ in launched - warmed)}"


class _CountingCompileMode:
    """Stands in for Triton's asynchronous compile mode where there is none (the interpreter): counts
    the batches and which dry runs ran inside each."""

    batches: ClassVar[list[list[str]]] = []

    def __init__(self, executor):
        self.future_kernels = {}
        self.raw_futures = []

    def __enter__(self):
        self.batches.append([])
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.single_op
def test_dry_runs_of_new_kernel_classes_compile_in_one_batch_and_only_once(monkeypatch):
    """All the dry runs handed over together run under one compile mode, each while launches only warm
    up; a class compiled before is skipped (a second batch of only such classes opens no mode)."""
    _CountingCompileMode.batches = []
    monkeypatch.setattr(compile_ahead, "_async_compile_mode", lambda: _CountingCompileMode)
    monkeypatch.setattr(compile_ahead, "_done", set())

    def dry(name):
        def run():
            assert compile_ahead._compiling_only.get(), "a dry run outside the compiling-only mode"
            _CountingCompileMode.batches[-1].append(name)

        return run

    compile_ahead.compile_ahead({"a": dry("a"), "b": dry("b")})
    compile_ahead.compile_ahead({"b": dry("b again"), "c": dry("c")})
    compile_ahead.compile_ahead({"a": dry("a again"), "c": dry("c again")})
    assert _CountingCompileMode.batches == [["a", "b"], ["c"]]
    assert not compile_ahead._compiling_only.get()


class _ThreadedCompileMode:
    """Triton 3.9's asynchronous compile mode in what compile_ahead relies on: each submitted compile
    runs on the executor, and the mode drops its futures when it ends."""

    active: ClassVar[_ThreadedCompileMode | None] = None

    def __init__(self, executor):
        self.executor, self.raw_futures, self.future_kernels = executor, [], {}

    def submit(self, key, compile_fn):
        future = self.executor.submit(compile_fn)
        self.raw_futures.append(future)
        self.future_kernels[key] = future

    def __enter__(self):
        _ThreadedCompileMode.active = self
        return self

    def __exit__(self, *exc):
        for future in self.raw_futures:
            future.result()
        self.raw_futures, self.future_kernels = [], {}
        _ThreadedCompileMode.active = None
        return False


@dataclasses.dataclass
class _Binary:
    src: object
    metadata: str = "the binary's metadata"


@pytest.mark.single_op
def test_every_binary_compiled_ahead_gets_its_launcher_built_beside_its_compile(monkeypatch):
    """Where Triton's compile closure holds the kernel's source (its jit does), the launcher builds from
    that source beside the compile, not after it (built after, the longest compile's launcher lengthened
    the batch by a C compiler run); a compile whose source is not to be had gets its launcher once
    compiled, with the binary's metadata. Also where the compile mode forgets its futures when it ends."""
    from triton.compiler import ASTSource

    monkeypatch.setattr(compile_ahead, "_async_compile_mode", lambda: _ThreadedCompileMode)
    monkeypatch.setattr(compile_ahead, "_launchers_compile", lambda: True)
    monkeypatch.setattr(compile_ahead, "_done", set())
    built, begun = [], threading.Event()

    def build(source, metadata):
        built.append((source.name, type(metadata).__name__))
        begun.set()

    monkeypatch.setattr(compile_ahead, "_build_launcher", build)
    seen_early = []

    def with_source():
        source = ASTSource(triton_l2norm._l2norm_fwd_kernel, {"x": "*fp32"})

        def compile_fn():
            seen_early.append(begun.wait(timeout=5))  # the launcher's build begins while this compiles
            return _Binary(source)

        return compile_fn

    def without_source(name):
        return lambda: _Binary(type("Source", (), {"name": name})())

    def dry():
        _ThreadedCompileMode.active.submit("a", with_source())
        _ThreadedCompileMode.active.submit("b", without_source("_b_kernel"))

    compile_ahead.compile_ahead({"a": dry})
    assert seen_early == [True]
    assert sorted(built) == [("_b_kernel", "str"), ("_l2norm_fwd_kernel", "_MetadataNotYet")]


@pytest.mark.single_op
def test_compiles_start_once_every_dry_run_of_the_batch_is_done(monkeypatch):
    """No compile starts while a dry run of the batch still issues launches (the compiles' own Python
    held the interpreter's lock against it); all start once the dry runs are done, and a dry run that
    fails leaves no compile waiting: its error comes out once they are done."""
    monkeypatch.setattr(compile_ahead, "_async_compile_mode", lambda: _ThreadedCompileMode)
    monkeypatch.setattr(compile_ahead, "_launchers_compile", lambda: False)
    monkeypatch.setattr(compile_ahead, "_done", set())
    monkeypatch.setattr(compile_ahead, "_build_launcher", lambda *built: None)
    compiled, seen_during = [], []

    def dry(name, error=None):
        def run():
            _ThreadedCompileMode.active.submit(name, lambda: compiled.append(name) or _Binary(None))
            time.sleep(0.2)
            seen_during.append(list(compiled))
            if error is not None:
                raise error

        return run

    compile_ahead.compile_ahead({"a": dry("a"), "b": dry("b")})
    assert seen_during == [[], []] and sorted(compiled) == ["a", "b"]
    outcome = []

    def failing_batch():
        try:
            compile_ahead.compile_ahead({"c": dry("c", ValueError("dry run failed"))})
        except ValueError as error:
            outcome.append(str(error))

    batch = threading.Thread(target=failing_batch, daemon=True)
    batch.start()
    batch.join(timeout=10)
    assert outcome == ["dry run failed"] and "c" in compiled


@pytest.mark.single_op
def test_held_compiles_start_longest_source_first_with_meanwhile_beside_them(monkeypatch):
    """The held compiles start in order of their kernel's source length, longest first (it ranks their
    compile times; the longest one bounds the batch), whatever order the dry runs handed them over
    in; and `meanwhile` runs while they compile, not after (here the first compile waits for it)."""
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(compile_ahead, "_async_compile_mode", lambda: _ThreadedCompileMode)
    monkeypatch.setattr(compile_ahead, "_launchers_compile", lambda: False)
    monkeypatch.setattr(compile_ahead, "_done", set())
    monkeypatch.setattr(compile_ahead, "_workers", lambda: 1)  # one worker: compiles run in start order
    monkeypatch.setattr(compile_ahead, "_build_launcher", lambda *built: None)
    order, meanwhile_ran = [], threading.Event()
    waited = []

    def compile_of(kernel):  # a JITFunction, as Triton's jit hands over, also where the kernel is interpreted
        source = ASTSource(JITFunction(kernel.fn), {"x": "*fp32"})

        def compile_fn():
            if not order:
                waited.append(meanwhile_ran.wait(timeout=5))
            order.append(source.name)
            return _Binary(source)

        return compile_fn

    def dry():
        for kernel in (triton_l2norm._l2norm_fwd_kernel, wy_bwd._wy_bwd_kernel, qk_grads._qk_grads_kernel):
            _ThreadedCompileMode.active.submit(kernel.fn.__name__, compile_of(kernel))

    compile_ahead.compile_ahead({"a": dry}, meanwhile_ran.set)
    assert order == ["_wy_bwd_kernel", "_qk_grads_kernel", "_l2norm_fwd_kernel"]
    assert waited == [True]


@pytest.mark.single_op
def test_held_compiles_run_their_front_ends_one_at_a_time_in_turn(monkeypatch):
    """The front ends of a batch's compiles (Triton's code generator, which holds the interpreter's lock)
    run one at a time, longest kernel source first, while the rest of each compile runs in parallel;
    a compile that needs no front end (its binary was in Triton's cache) gives up its turn; afterwards
    each source is left without the batch's gate."""
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(compile_ahead, "_async_compile_mode", lambda: _ThreadedCompileMode)
    monkeypatch.setattr(compile_ahead, "_launchers_compile", lambda: False)
    monkeypatch.setattr(compile_ahead, "_done", set())
    monkeypatch.setattr(compile_ahead, "_workers", lambda: 4)
    monkeypatch.setattr(compile_ahead, "_build_launcher", lambda *built: None)
    log, sources = [], []

    def compile_of(kernel, cached=False):
        source = ASTSource(JITFunction(kernel.fn), {"x": "*fp32"})
        sources.append(source)

        def make_ir(*args):  # stands in for Triton's code generator
            log.append(("in", source.name))
            time.sleep(0.05)
            log.append(("out", source.name))

        source.make_ir = make_ir

        def compile_fn():
            if not cached:
                source.make_ir()
            time.sleep(0.1)  # the lowering
            return _Binary(source)

        return compile_fn

    def dry():
        for kernel, cached in (
            (triton_l2norm._l2norm_fwd_kernel, False),
            (wy._prepare_kernel, True),
            (qk_grads._qk_grads_kernel, False),
            (wy_bwd._wy_bwd_kernel, False),
        ):
            _ThreadedCompileMode.active.submit(kernel.fn.__name__, compile_of(kernel, cached))

    batch = threading.Thread(target=compile_ahead.compile_ahead, args=({"a": dry},), daemon=True)
    batch.start()
    batch.join(timeout=10)
    names = ["_wy_bwd_kernel", "_qk_grads_kernel", "_l2norm_fwd_kernel"]
    assert log == [(side, name) for name in names for side in ("in", "out")]
    assert all("make_ir" not in vars(source) for source in sources)


@pytest.mark.single_op
@pytest.mark.skipif(is_interpreting(), reason="needs compiled kernels (a CUDA device)")
def test_first_call_of_a_kernel_class_finds_its_binaries_compiled(monkeypatch, gen):
    """The first forward+backward of a new kernel class compiles its binaries ahead (in parallel),
    so that the call itself compiles none, and its result is the fp64 recurrence's."""
    if not compile_ahead.supported():
        pytest.skip(f"Triton {triton.__version__} has no asynchronous compile mode: kernels compile at launch")
    kernels = [k for m in KERNEL_MODULES for n, k in vars(m).items() if n.startswith("_") and n.endswith("_kernel")]
    counts = {}
    apply = triton_chunk.ChunkGatedDeltaRuleFunction.apply

    def counting_apply(*args):
        counts["ahead"] = sum(compiled_binaries(k) for k in kernels)
        return apply(*args)

    monkeypatch.setattr(triton_chunk.ChunkGatedDeltaRuleFunction, "apply", counting_apply)
    late = []
    once_compiled = compile_ahead._build_launcher_once_compiled
    monkeypatch.setattr(compile_ahead, "_build_launcher_once_compiled", lambda f: late.append(f) or once_compiled(f))
    before = sum(compiled_binaries(k) for k in kernels)
    # head counts and dims no other test uses: a kernel class new to this process
    inputs = make_inputs(gen, 150, 3, 9, 40, 40, N=2, dtype=torch.bfloat16)
    check_against_recurrence(
        gen, inputs, TOL[torch.bfloat16], cu_seqlens=[0, 70, 150], l2norm=True, tol_of=HALF_REDUCED_GRAD_TOL
    )
    after = sum(compiled_binaries(k) for k in kernels)
    assert counts["ahead"] > before, "nothing was compiled ahead"
    assert after == counts["ahead"], f"the call compiled {after - counts['ahead']} binaries after the dry run"
    if compile_ahead._launchers_compile():  # this Triton's jit hands over each compile's source: none late
        assert not late, f"{len(late)} launchers built only once their binary was"


def first_call(gen, dtype=torch.bfloat16):
    """A dense bf16 call without states (the call of a model's first forward) in a kernel class no other
    test uses, validated with gradients wanted."""
    leaves = [x.to(DEVICE).requires_grad_() for x in make_inputs(gen, 96, 3, 6, 24, 40, N=2, dtype=dtype)[:5]]
    return PREPARE["chunk_gated_delta_rule"](*leaves, use_qk_l2norm_in_kernel=True)


class _CasesHandedOverError(Exception):
    pass


def probe_calls(like) -> list:
    """The validated calls of every case the numeric probe runs when `like` asks for the op first (as
    the probe hands them to compile_ahead, before it runs any)."""
    handed: list = []

    def grab(calls, meanwhile):
        handed.extend(calls)
        raise _CasesHandedOverError

    with pytest.raises(_CasesHandedOverError):
        numeric_probe.probe_op(
            "chunk_gated_delta_rule",
            triton_chunk.chunk_gated_delta_rule,
            torch.device(DEVICE),
            eager=EAGER.ops["chunk_gated_delta_rule"],
            like=like,
            compile_ahead=grab,
        )
    return handed


@pytest.mark.single_op
@pytest.mark.skipif(not is_interpreting(), reason="the interpreter variant; CUDA counts compiled binaries")
def test_probe_of_the_first_call_warms_every_binary_it_launches(monkeypatch, gen):
    """The numeric probe runs in the class of the call that asked for the op, so compiling its cases
    ahead compiles every binary that call then launches (the probe's fp32 cases shared none), and no
    other: its packed case takes the call's states too (a training call's none), where it once passed
    an initial state and asked for the final one, and compiled five binaries the call never launched.
    Besides, the packed plan's table kernels for int32 and int64 offsets, which a packed call of the
    class would launch."""
    like = first_call(gen)
    launches = Launches(monkeypatch)
    calls = probe_calls(like)
    assert [call.q.dtype for call in calls] == [torch.bfloat16] * 2
    for call in calls:
        compile_ahead.dry_run(triton_chunk._dry_run_of(call)[1])
    probed = {(k.fn.__name__, specialization_key(k, a, kw)) for k, _, a, kw, _ in launches.calls}
    launches.calls.clear()
    o, _ = triton_chunk.chunk_gated_delta_rule(like)
    o.float().sum().backward()
    launched = {(k.fn.__name__, specialization_key(k, a, kw)) for k, _, a, kw, _ in launches.calls}
    assert len(launched) >= 9
    assert launched <= probed, f"binaries the probe did not compile: {sorted(name for name, _ in launched - probed)}"
    unused = sorted(name for name, _ in probed - launched)
    assert unused == ["_chunk_rows_kernel", "_offsets_kernel", "_offsets_kernel"], (
        f"binaries the call does not launch: {unused}"
    )


@pytest.mark.single_op
@pytest.mark.skipif(is_interpreting(), reason="needs compiled kernels (a CUDA device)")
def test_resolution_by_the_first_call_compiles_every_binary_it_launches(monkeypatch, gen):
    """Resolving the op for its first call (probe included, in that call's class) leaves nothing for
    the call itself to compile, and the probe passed at the tolerance of bf16 inputs."""
    kernels = [k for m in KERNEL_MODULES for n, k in vars(m).items() if n.startswith("_") and n.endswith("_kernel")]
    like = first_call(gen)
    monkeypatch.setattr(resolver, "_cache", {})
    with resolver.compute_mode_override("triton"):
        resolution = resolver.resolve("chunk_gated_delta_rule", like.device, like)
    assert resolution.backend == "triton", resolution.rejected
    assert resolution.probe["inputs"]["dtype"] == "bfloat16" and resolution.probe["inputs"]["HV"] == 6
    bf16_floor = numeric_probe.HALF_PRECISION_TOLERANCE["chunk_gated_delta_rule"][torch.bfloat16]
    assert resolution.probe["tolerance"] == bf16_floor
    before = sum(compiled_binaries(k) for k in kernels)
    o, _ = triton_chunk.chunk_gated_delta_rule(like)
    o.float().sum().backward()
    after = sum(compiled_binaries(k) for k in kernels)
    assert after == before, f"the first call compiled {after - before} binaries the probe had not"


@pytest.mark.single_op
def test_many_sequences_stay_within_launch_limits(monkeypatch):
    """70000 one-token sequences: the per-chunk and per-sequence grid axes are axis 0 (2^31 - 1); axes
    1 and 2 carry only head and slice counts (65535 at most). On a device of an H200's SMs, where the
    first call's dry run also launches the split state passes of its kernel class (one sequence of
    these heads would split; the interpreter compiles nothing ahead)."""
    monkeypatch.setattr(config, "processors", lambda device: 132)
    # the dry run is once per kernel class and process: another test in this worker may have had it
    monkeypatch.setattr(compile_ahead, "_done", set())
    launches = Launches(monkeypatch)
    N = 70_000
    run_op(N, cu_seqlens=list(range(N + 1)), N=N)
    chunk_kernels = {
        kernel
        for kernel, _, _, _, _ in launches.calls
        if "l2norm" not in kernel.fn.__name__ and kernel.fn.__name__ not in TABLE_KERNELS
    }
    split = {"_state_fwd_summary_kernel", "_state_bwd_summary_kernel", "_state_combine_kernel"}
    names = {kernel.fn.__name__ for kernel in chunk_kernels}
    # the output kernel runs where the state slices are narrower than tiles.output_in_state_bv (the GPU's
    # 16 columns here, V = 16), not under the interpreter, whose state passes write the output
    assert ("_output_kernel" in names) != is_interpreting(), names
    assert len(names - split - {"_output_kernel"}) == 7, names
    assert names & split == (set() if is_interpreting() else split), names
    for kernel, grid, _, _, _ in launches.calls:
        assert grid[0] < 2**31 and all(axis <= 65535 for axis in grid[1:]), (kernel.fn.__name__, grid)
        if kernel in chunk_kernels:
            assert grid[0] >= N, (kernel.fn.__name__, grid)


@pytest.mark.single_op
@pytest.mark.skipif(is_interpreting(), reason="needs compiled kernels (a CUDA device)")
def test_a_sequence_past_32_bit_state_offsets():
    """One sequence of 270,000 tokens with 32 value heads of 128 x 128: the state rows of its last
    chunks lie past 2^31 elements from its first (chunk 4096 on). Forward against the eager backend."""
    from gdn.backends.eager import gated_delta

    free, _ = torch.cuda.mem_get_info()
    if free < 40 * 2**30:
        pytest.skip(f"needs 40 GiB of free GPU memory, {free / 2**30:.0f} free")
    gen = torch.Generator(DEVICE).manual_seed(0)  # drawn on the device: 2.2e9 values

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=gen, dtype=torch.bfloat16)

    T = 270_000
    q, k, v = randn(1, T, 16, 128), randn(1, T, 16, 128), randn(1, T, 32, 128)
    g = -torch.rand(1, T, 32, device=DEVICE, generator=gen) * 0.5
    beta = torch.rand(1, T, 32, device=DEVICE, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        calls = [
            PREPARE["chunk_gated_delta_rule"](q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
            for _ in range(2)
        ]
        o, final = triton_chunk.chunk_gated_delta_rule(calls[0])
        ro, rfinal = gated_delta.chunk_gated_delta_rule(calls[1])
    errors = {"o": rel_err(o, ro), "o past 2^31": rel_err(o[:, 262_144:], ro[:, 262_144:])}
    errors["final_state"] = rel_err(final, rfinal)
    assert all(err <= TOL[torch.bfloat16] for err in errors.values()), errors
