"""The decode ops on `npu_recurrent_gated_delta_rule`: fused_recurrent_gated_delta_rule and the
state-pool variant.

The op is token-major (query [T, H, K], g and beta [T, HV]), takes q/k/v/beta in bf16 and g in fp32,
and updates a value-first state pool [blocks, HV, V, K] in place: a sequence starts from the block of
its first token and every token writes its state to its own block (ssm_state_indices [T]). Our states
are key-first ([.., K, V]), so each call runs on a value-first scratch copy of the rows it needs and
writes the results back; empty sequences and pool rows marked -1 never reach the kernel. The op has
no backward: the backend declares these ops forward-only (the resolver runs calls that need gradients
eager), and a direct call with inputs that require grad is refused rather than given silently missing
gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gdn.backends.ascendc.layout import sequences
from gdn.backends.eager.gated_delta import l2norm_fp32
from gdn.calls import GdnCall, PoolDecodeCall
from gdn.pool_rows import offsets_in_order, pool_rows

OP = "npu_recurrent_gated_delta_rule"


def _refuse_grad(op: str, *tensors: torch.Tensor | None) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(
            f"{op}: the ascendc backend runs it on {OP}, which has no backward (decode only); inputs that "
            "require grad need chunk_gated_delta_rule or another backend (GDN_COMPUTE_MODE)"
        )


def _decode(kernel: Callable, q, k, v, g, beta, lengths: list[int], state, scale: float, l2norm: bool):
    """Token-major q, k [tokens, H, K], v [tokens, HV, V], g, beta [tokens, HV] of the sequences in
    `lengths` (all non-empty), state [sequences, HV, K, V] -> (out [tokens, HV, V], final state)."""
    if l2norm:
        q, k = l2norm_fp32(q), l2norm_fp32(k)
    device = q.device
    pool = state.float().transpose(-1, -2).contiguous()
    sizes = torch.tensor(lengths, dtype=torch.int32, device=device)
    blocks = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32, device=device), sizes)
    bf16 = torch.bfloat16
    out = kernel(
        q.to(bf16).contiguous(),
        k.to(bf16).contiguous(),
        v.to(bf16).contiguous(),
        pool,
        beta=beta.to(bf16).contiguous(),
        scale=scale,
        actual_seq_lengths=torch.cat([sizes.new_zeros(1), sizes]),
        ssm_state_indices=blocks,
        g=g.float().contiguous(),
    )
    return out, pool.transpose(-1, -2)


def _tokens(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, *x.shape[2:])


def make_recurrent_ops(kernel: Callable) -> dict[str, Callable]:
    def fused_recurrent_gated_delta_rule(call: GdnCall):
        q, k, v, g, beta, shapes = call.q, call.k, call.v, call.g, call.beta, call.shapes
        initial_state, output_final_state = call.initial_state, call.output_final_state
        _refuse_grad("fused_recurrent_gated_delta_rule", q, k, v, g, beta, initial_state)
        seqs = sequences(shapes.B, shapes.T, call.cu_seqlens)
        kept = seqs.kept_index(q.device)
        if initial_state is None:
            state = torch.zeros(len(seqs.kept), shapes.HV, shapes.K, shapes.V, device=q.device)
        else:
            state = initial_state.index_select(0, kept)
        out, final = _decode(
            kernel,
            *(_tokens(x) for x in (q, k, v, g, beta)),
            [seqs.lengths[n] for n in seqs.kept],
            state,
            call.scale,
            call.use_qk_l2norm_in_kernel,
        )
        o = out.view(shapes.B, shapes.T, shapes.HV, shapes.V).to(v.dtype)
        if not output_final_state or not seqs.drops_any:
            return o, final if output_final_state else None
        # an empty sequence passes its state through untouched
        start = initial_state.float() if initial_state is not None else final.new_zeros(shapes.N, *final.shape[1:])
        return o, start.index_copy(0, kept, final)

    def fused_recurrent_gated_delta_rule_update(call: PoolDecodeCall):
        """The pool's rows are read and written here, in torch, from the slots read on the host: reaching
        here without the host checks, a slot out of range or repeated gives its sequence NaN outputs and
        leaves its slot untouched, and offsets out of order do so for every sequence (gdn.pool_rows)."""
        q, k, v, g, beta, shapes, ssm_pool = call.q, call.k, call.v, call.g, call.beta, call.shapes, call.ssm_pool
        _refuse_grad("fused_recurrent_gated_delta_rule_update", q, k, v, g, beta)
        if call.cu_seqlens is not None and not offsets_in_order(call.cu_seqlens.tolist(), shapes.T):
            return torch.full_like(v, float("nan"))
        seqs = sequences(shapes.B, shapes.T, call.cu_seqlens)
        rows = pool_rows(call.ssm_indices.tolist(), ssm_pool.shape[0])
        slots = rows.kept
        starts = [sum(seqs.lengths[:n]) for n in range(len(seqs.lengths))]
        o = v.new_zeros(shapes.B, shapes.T, shapes.HV, shapes.V)
        for n in rows.refused:
            o.view(-1, shapes.HV, shapes.V)[starts[n] : starts[n] + seqs.lengths[n]] = float("nan")
        live = [n for n in seqs.kept if slots[n] >= 0]
        if not live:
            return o
        token_idx = torch.tensor(
            [t for n in live for t in range(starts[n], starts[n] + seqs.lengths[n])], device=q.device
        )
        live_slots = torch.tensor([slots[n] for n in live], device=q.device)
        out, final = _decode(
            kernel,
            *(_tokens(x).index_select(0, token_idx) for x in (q, k, v, g, beta)),
            [seqs.lengths[n] for n in live],
            ssm_pool.index_select(0, live_slots),
            call.scale,
            call.use_qk_l2norm_in_kernel,
        )
        ssm_pool.index_copy_(0, live_slots, final.to(ssm_pool.dtype))
        o.view(-1, shapes.HV, shapes.V).index_copy_(0, token_idx, out.to(o.dtype))
        return o

    return {
        "fused_recurrent_gated_delta_rule": fused_recurrent_gated_delta_rule,
        "fused_recurrent_gated_delta_rule_update": fused_recurrent_gated_delta_rule_update,
    }
