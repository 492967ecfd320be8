"""`chunk_gated_delta_rule` of the triton backend: the chunked WY algorithm (docs/design.md) as a chain
of Triton kernels, one module per stage under `common/`.

Forward: l2norm (optional) -> gate cumsum and (I + A)^-1 -> w, u -> state pass -> output (where the
state pass runs wide slices, it writes the output itself: `state.writes_output`).
Backward: w, u and the per-chunk states are recomputed (cheaper than keeping them: the states alone
are K*V values per chunk and head), then local dv -> reverse state pass (dh, dv, dh0) -> dq, dk (per
value head), dw and the gate gradient per chunk -> WY backward (dq and dk summed over each group and
through the l2norm's backward, dv, dbeta, dg).

Autograd keeps q and k (normalised), v, beta, the cumulative gate (fp32), T = (I + A)^-1 (64 values
per token and head) and the initial state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from gdn.backends.triton._common import OpKernel, flavour, is_interpreting
from gdn.backends.triton.chunk_index import ChunkPlan, plan_chunks, read_back, split_sequences, warm_plan_kernels
from gdn.backends.triton.common.config import CHUNK, Tiles, could_split, segment_length, tiles_for
from gdn.backends.triton.common.output import chunk_output, dv_local
from gdn.backends.triton.common.qk_grads import qk_grads
from gdn.backends.triton.common.state import state_backward, state_forward, state_forward_output, writes_output
from gdn.backends.triton.common.wy import wy_apply, wy_prepare
from gdn.backends.triton.common.wy_bwd import wy_backward
from gdn.backends.triton.compile_ahead import compile_ahead
from gdn.backends.triton.l2norm import l2norm_fwd
from gdn.calls import GdnCall

L2NORM_EPS = 1e-6


def _fp32_dot(dtype: torch.dtype) -> str | None:
    """The precision of fp32 dots (None: dots in the input dtype). Always fp32 under the interpreter,
    whose bf16 dot is wrong; for fp32 inputs a precision that keeps their accuracy (plain TF32 does not)."""
    if is_interpreting():
        return "ieee"
    if dtype != torch.float32:
        return None
    return _gpu_fp32_precision()


@functools.cache
def _gpu_fp32_precision() -> str:
    # NVIDIA's 3xTF32 is fp32-accurate on the tensor cores; other targets take plain IEEE products.
    return "tf32x3" if flavour().target == "cuda" else "ieee"


@dataclass(frozen=True)
class _Saved:
    """What the backward needs from the forward besides its tensors."""

    g_dtype: torch.dtype
    scale: float
    plan: ChunkPlan
    tiles: Tiles
    fp32_dot: str | None
    use_qk_l2norm_in_kernel: bool


def _forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    scale: float,
    output_final_state: bool,
    plan: ChunkPlan,
    use_qk_l2norm_in_kernel: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, tuple, _Saved]:
    """-> (o, final state, the tensors the backward keeps, the rest it needs)."""
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    if initial_state is not None:
        initial_state = initial_state.contiguous()
    q_rstd = k_rstd = None
    if use_qk_l2norm_in_kernel:
        q, q_rstd = l2norm_fwd(q, L2NORM_EPS)
        k, k_rstd = l2norm_fwd(k, L2NORM_EPS)
    tiles, fp32_dot = tiles_for(k.shape[-1], v.shape[-1], k.element_size()), _fp32_dot(k.dtype)
    HV = v.shape[2]

    gc, Ai = wy_prepare(k, g, beta, HV, plan, tiles, fp32_dot)
    exact_dot = _fp32_dot(torch.float32)
    if writes_output(tiles, plan, HV, v.shape[3], k.device):
        # the pass forms v_new from Ai itself: only a split's summaries read w and u
        wu = None if plan.split is None else wy_apply(k, v, beta, gc, Ai, plan, tiles, fp32_dot)
        o, final_state = state_forward_output(
            q, k, v, beta, Ai, wu, gc, initial_state, output_final_state, scale, plan, tiles, fp32_dot, exact_dot
        )
    else:
        w, u = wy_apply(k, v, beta, gc, Ai, plan, tiles, fp32_dot)
        h, v_new, final_state, _ = state_forward(
            k, w, u, gc, initial_state, output_final_state, plan, tiles, fp32_dot, exact_dot
        )
        del w, u  # u is v_new now; w ([T, HV, K]) is not read again: free it before o is allocated
        o = chunk_output(q, k, v_new, h, gc, scale, v.dtype, plan, tiles, fp32_dot)
    kept = (q, k, v, beta, gc, Ai, initial_state, q_rstd, k_rstd)
    return o, final_state, kept, _Saved(g.dtype, scale, plan, tiles, fp32_dot, use_qk_l2norm_in_kernel)


def _backward(
    kept: tuple, saved: _Saved, do: torch.Tensor, dht: torch.Tensor | None, want_dh0: bool
) -> tuple[torch.Tensor, ...]:
    """-> (dq, dk, dv, dg, dbeta, dh0 or None), each in its input's dtype."""
    q, k, v, beta, gc, Ai, initial_state, q_rstd, k_rstd = kept
    plan, tiles, fp32_dot, scale = saved.plan, saved.tiles, saved.fp32_dot, saved.scale
    do = do.contiguous()
    if dht is not None:
        dht = dht.contiguous()
    want_dh0 = want_dh0 and initial_state is not None

    w, u = wy_apply(k, v, beta, gc, Ai, plan, tiles, fp32_dot)
    exact_dot = _fp32_dot(torch.float32)
    h, v_new, _, maps = state_forward(k, w, u, gc, initial_state, False, plan, tiles, fp32_dot, exact_dot)
    dv = dv_local(q, k, gc, do, scale, plan, tiles, fp32_dot)
    dh, dv, dh0 = state_backward(q, k, w, gc, do, dv, dht, want_dh0, scale, plan, tiles, fp32_dot, exact_dot, maps)
    del w, u, maps  # as in the forward: freed before qk_grads allocates its outputs
    # the parts may be written over dh and dw over v_new (qk_grads says where)
    parts, dw, dG = qk_grads(q, k, v_new, h, dh, gc, do, dv, scale, plan, tiles, fp32_dot)
    del h, dh, v_new
    rstd = (q_rstd, k_rstd) if saved.use_qk_l2norm_in_kernel else None
    dq, dk, dv, dbeta, dg = wy_backward(q, k, v, beta, gc, Ai, dw, dv, parts, dG, rstd, plan, tiles, fp32_dot)
    del parts, dw
    return (
        dq.to(q.dtype),
        dk.to(k.dtype),
        dv.to(v.dtype),
        dg.to(saved.g_dtype),
        dbeta.to(beta.dtype),
        None if dh0 is None else dh0.to(initial_state.dtype),
    )


class ChunkGatedDeltaRuleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *arguments):
        """`arguments` are `_forward`'s, as `_arguments` lists them."""
        o, final_state, kept, saved = _forward(*arguments)
        ctx.save_for_backward(*kept)
        ctx.saved = saved
        return o, final_state

    @staticmethod
    def backward(ctx, do: torch.Tensor, dht: torch.Tensor | None):
        grads = _backward(ctx.saved_tensors, ctx.saved, do, dht, ctx.needs_input_grad[5])
        return (*grads, None, None, None, None)


def _arguments(call: GdnCall, plan: ChunkPlan) -> tuple:
    """`_forward`'s arguments for a call; the initial state is the sixth (its gradient's index)."""
    return (
        call.q,
        call.k,
        call.v,
        call.g,
        call.beta,
        call.initial_state,
        call.scale,
        call.output_final_state,
        plan,
        call.use_qk_l2norm_in_kernel,
    )


def _needs_grad(call: GdnCall) -> bool:
    inputs = (call.q, call.k, call.v, call.g, call.beta, call.initial_state)
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)


def _kernel_class(call: GdnCall, needs_grad: bool) -> tuple:
    """What decides the binaries a call launches (lengths never do, nor whether the sequences are packed:
    both are runtime arguments)."""
    s = call.shapes
    h0 = call.initial_state
    return (
        "chunk_gated_delta_rule",
        call.q.device,
        *(x.dtype for x in (call.q, call.k, call.v, call.g, call.beta)),
        None if h0 is None else (h0.dtype, h0.requires_grad),
        s.H,
        s.HV,
        s.K,
        s.V,
        call.output_final_state,
        call.use_qk_l2norm_in_kernel,
        needs_grad,
    )


def _dry_step(call: GdnCall, needs_grad: bool) -> None:
    """The call's launches on unwritten data: its plan's (and for int32 and int64 offsets, those of a
    packed call of the class), the forward's and, when a backward will follow, the backward's; where
    the class's state passes could split a sequence, with and without the split, so that neither a
    longer nor a shorter call of the class compiles a binary of its own."""
    h0 = call.initial_state
    s = call.shapes
    warm_plan_kernels(call.q.device)
    plan = _plan(call)
    plans = [plan]
    if could_split(tiles_for(s.K, s.V, call.k.element_size()), s.HV, s.V, call.q.device):
        whole = replace(plan, split=None)
        if whole.longest is None:  # a packed call of many sequences: one sequence of the class splits
            whole = read_back(whole)
        plans = [whole, split_sequences(whole, max(1, whole.longest))]
    with torch.no_grad():
        for plan in plans:
            o, final_state, kept, saved = _forward(*_arguments(call, plan))
            if needs_grad:
                dht = None if final_state is None else torch.empty_like(final_state)
                _backward(kept, saved, torch.empty_like(o), dht, h0 is not None and h0.requires_grad)
            del o, final_state, kept  # not held while the next plan's buffers are allocated


def chunk_gated_delta_rule(call: GdnCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The backend entry (inputs validated by gdn.calls): -> (o [B, T, HV, V] in v's dtype, final state
    [N, HV, K, V] fp32 or None). The first call of each kernel class compiles its forward's and
    backward's binaries ahead, in parallel (its plan's too: planned after)."""
    compile_ahead(dict([_dry_run_of(call)]))
    return ChunkGatedDeltaRuleFunction.apply(*_arguments(call, _plan(call)))


def _plan(call: GdnCall) -> ChunkPlan:
    """The call's plan: computed on the device, read back to the host only where the class's state
    passes could split a packed call's sequences (config.could_split: few sequences and heads). While
    a CUDA graph captures, a packed call keeps its sequences whole: the read-back cannot be captured,
    and the split only makes the state passes faster (its kernel class compiled both plans)."""
    s = call.shapes
    device = call.q.device
    plan = plan_chunks(s.B, s.T, call.cu_seqlens, CHUNK, device)
    tiles = tiles_for(s.K, s.V, call.k.element_size())
    if not could_split(tiles, plan.num_sequences * s.HV, s.V, device):
        return plan
    if plan.is_varlen:
        if _capturing(device):
            return plan
        plan = read_back(plan)
    length = segment_length(tiles, plan.num_sequences * s.HV, s.HV, s.V, plan.longest, device)
    return split_sequences(plan, length) if length else plan


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _dry_run_of(call: GdnCall) -> tuple[tuple, functools.partial]:
    """(the call's kernel class, its dry step)."""
    needs_grad = _needs_grad(call)
    return _kernel_class(call, needs_grad), functools.partial(_dry_step, call, needs_grad)


def compile_calls_ahead(calls: list[GdnCall], meanwhile: Callable[[], object] | None = None) -> None:
    """Compile, in one parallel batch, the forward's and (where gradients will be taken) backward's
    binaries of every kernel class among the calls not compiled before. A class's dry run makes the
    dry steps of all its calls in the batch (a dense and a packed call, the numeric probe's cases): on
    the H200 a dense probe case compiled binaries at its launches when only the packed case of its
    class had been dry-run, which the interpreter's specializations do not show. `meanwhile` runs while
    they compile (compile_ahead)."""
    steps: dict[tuple, list[functools.partial]] = {}
    for call in calls:
        kernel_class, step = _dry_run_of(call)
        steps.setdefault(kernel_class, []).append(step)
    compile_ahead({kernel_class: functools.partial(_each, found) for kernel_class, found in steps.items()}, meanwhile)


def _each(steps: list[functools.partial]) -> None:
    for step in steps:
        step()


# The ops this module serves (TritonBackend.loader). The chunk kernels take fp32 inputs with IEEE fp32
# products (no TF32; common/tiles.py `mma`), so the probe holds them to 1e-4: summation order leaves
# them about 1e-6 from eager's fp32, and a wrong term costs far more. The op plans a packed batch on the
# device and checks cu_seqlens there (chunk_index.py), so a packed prefill never reads it on the host.
OPS = {
    "chunk_gated_delta_rule": OpKernel(chunk_gated_delta_rule, guards_values=True, probe_tolerance=1e-4),
}
