"""Gated delta rule in plain PyTorch: the chunked WY form and the token recurrence.

Recurrence (per value head, state S in [K, V]):
    S_t = exp(g_t) * S_{t-1} + k_t u_t^T,   u_t = beta_t * (v_t - exp(g_t) * S_{t-1}^T k_t),
    o_t = scale * S_t^T q_t.
Within a chunk of C tokens, with G_t = cumsum(g) from the chunk start and S_0 the entering state,
the u_t solve the unit lower-triangular system (I + A) U = beta*V - diag(beta*exp(G)) K S_0 with
A_ij = beta_i k_i.k_j exp(G_i - G_j) for j < i. So U = u - w S_0 with u = T(beta*V),
w = T(beta*exp(G)*K), T = (I + A)^-1, and every intra-chunk term is a batched matmul; only the
chunk-to-chunk state pass is a loop. All arithmetic runs in fp32; autograd gives the backward.
"""

from __future__ import annotations

import torch

from gdn._validate import GdnShapes
from gdn.backends.eager._blocks import BlockPlan, plan_blocks, sequence_lengths
from gdn.backends.eager.state_scan import StateScan
from gdn.calls import GdnCall, PoolDecodeCall
from gdn.gates import floored
from gdn.pool_rows import offsets_in_order, pool_rows

CHUNK = 64


def l2norm_fp32(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare(q, k, v, g, beta, shapes: GdnShapes, scale: float, use_qk_l2norm_in_kernel: bool):
    """Token-major fp32 tensors [B*T, HV, ...], with q/k normalised, scaled and shared across groups."""
    if use_qk_l2norm_in_kernel:
        q, k = l2norm_fp32(q), l2norm_fp32(k)
    group = shapes.HV // shapes.H
    tokens = shapes.B * shapes.T

    def per_value_head(x: torch.Tensor) -> torch.Tensor:
        x = x.float().reshape(tokens, shapes.H, -1)
        return x.repeat_interleave(group, dim=1) if group > 1 else x

    return (
        per_value_head(q) * scale,
        per_value_head(k),
        v.float().reshape(tokens, shapes.HV, shapes.V),
        g.float().reshape(tokens, shapes.HV),
        beta.float().reshape(tokens, shapes.HV),
    )


def _start_state(initial_state, shapes: GdnShapes, plan: BlockPlan, device) -> torch.Tensor:
    if initial_state is None:
        return torch.zeros(shapes.N, shapes.HV, shapes.K, shapes.V, dtype=torch.float32, device=device)
    return initial_state.float().index_select(0, plan.order)


def _run_steps(plan: BlockPlan, state: torch.Tensor, step_fn) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Carry the sorted state through every step; step_fn(slice, state_prefix) -> (out, new_prefix)."""
    outputs = []
    for offset, count in zip(plan.step_offsets, plan.active, strict=True):
        out, head = step_fn(slice(offset, offset + count), state[:count])
        outputs.append(out)
        state = head if count == state.shape[0] else torch.cat([head, state[count:]])
    return outputs, state.index_select(0, plan.inverse_order)


def _head_major(plan: BlockPlan, x: torch.Tensor, heads: int) -> torch.Tensor:
    """Token-major [B, T, heads, ...] -> [chunks, heads, CHUNK, ...] fp32, contiguous."""
    blocks = plan.to_blocks(x.reshape(plan.num_tokens, heads, *x.shape[3:]))
    return blocks.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)


def _intra_chunk(q, k, v, g, beta, shapes: GdnShapes, scale: float, use_qk_l2norm_in_kernel: bool, plan):
    """Everything that does not depend on the entering state, batched over all chunks.

    q/k stay at H heads; their products are broadcast over the HV // H value heads of each group
    rather than materialising repeated copies. Returns, per chunk and value head: u and w (so that
    v_new = u - w S), q_eff and o_intra (so that o = o_intra + q_eff S), the keys decayed to the chunk
    end (transposed) and the chunk's total decay."""
    H, HV = shapes.H, shapes.HV
    G = HV // H
    qh, kh = _head_major(plan, q, H), _head_major(plan, k, H)
    if use_qk_l2norm_in_kernel:
        qh, kh = l2norm_fp32(qh), l2norm_fp32(kh)
    qh = qh * scale
    vb = _head_major(plan, v, HV)
    # sums of gates over a chunk: a -inf gate (complete decay) would make them NaN (gdn.gates)
    gb, bb = floored(_head_major(plan, g, HV)), _head_major(plan, beta, HV)
    chunks = qh.shape[0]

    def by_group(x: torch.Tensor) -> torch.Tensor:  # [chunks, HV, ...] -> [chunks, H, G, ...]
        return x.view(chunks, H, G, *x.shape[2:])

    def per_value_head(x: torch.Tensor) -> torch.Tensor:  # [chunks, H, G, ...] -> [chunks, HV, ...]
        return x.reshape(chunks, HV, *x.shape[3:])

    def times_keys(x: torch.Tensor, per_row: torch.Tensor) -> torch.Tensor:  # x [chunks, H, C, D]
        return per_value_head(x.unsqueeze(2) * by_group(per_row.unsqueeze(-1)))

    g_cum = gb.cumsum(-1)  # padding carries g = 0, so the chunk-end decay is the last real token's
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    # Log decays between positions are sums of g over the segment, not differences of cumulative
    # sums: with strong gates G reaches thousands and G_i - G_j keeps only its absolute precision,
    # a relative error of 1e-3 on decays near 1. decay[i, j] = exp(sum g over (j, i]), masked above
    # the diagonal before exp so nothing overflows.
    rows = torch.where(causal, gb.unsqueeze(-2), 0.0)  # rows[i, t] = g_t for t <= i
    after = torch.ones(CHUNK, CHUNK, device=q.device).tril(-1)  # after[t, j] = 1 where t > j
    segment = rows @ after  # segment[i, j] = sum of g_t over j < t <= i (one matmul, no cancellation)
    decay = segment.masked_fill(~causal, float("-inf")).exp()

    kk = (kh @ kh.transpose(-1, -2)).unsqueeze(2)
    system = per_value_head(kk * by_group(decay * bb.unsqueeze(-1)))  # diagonal ignored: unitriangular
    u = torch.linalg.solve_triangular(system, vb * bb.unsqueeze(-1), upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, times_keys(kh, bb * g_cum.exp()), upper=False, unitriangular=True)

    attn = per_value_head((qh @ kh.transpose(-1, -2)).unsqueeze(2) * by_group(decay))
    q_eff = times_keys(qh, g_cum.exp()) - attn @ w
    o_intra = attn @ u
    k_to_end_t = times_keys(kh, _exclusive_suffix_sum(gb).exp()).transpose(-1, -2)
    return u, w, q_eff, o_intra, k_to_end_t, g_cum[..., -1:].exp().unsqueeze(-1)


def _exclusive_suffix_sum(x: torch.Tensor) -> torch.Tensor:
    """out[..., j] = sum of x[..., t] for t > j, summed from the end (no cancellation)."""
    suffix = x.flip(-1).cumsum(-1).flip(-1)
    return torch.cat([suffix[..., 1:], torch.zeros_like(suffix[..., :1])], dim=-1)


def chunk_gated_delta_rule(call: GdnCall):
    q, v, shapes = call.q, call.v, call.shapes
    plan = plan_blocks(sequence_lengths(shapes.B, shapes.T, call.cu_seqlens), CHUNK, q.device)
    u, w, q_eff, o_intra, k_to_end_t, state_decay = _intra_chunk(
        q, call.k, v, call.g, call.beta, shapes, call.scale, call.use_qk_l2norm_in_kernel, plan
    )
    # Between chunks: S_out = (decay * I - k_end^T w) S_in + k_end^T u.
    transition = (k_to_end_t @ w).neg_()
    transition.diagonal(dim1=-2, dim2=-1).add_(state_decay.squeeze(-1))
    entering, final = StateScan.apply(
        transition, k_to_end_t @ u, _start_state(call.initial_state, shapes, plan, q.device), plan
    )
    o = plan.to_tokens((o_intra + q_eff @ entering).transpose(1, 2))
    o = o.reshape(shapes.B, shapes.T, shapes.HV, shapes.V).to(v.dtype)
    return o, (final.index_select(0, plan.inverse_order) if call.output_final_state else None)


def fused_recurrent_gated_delta_rule(call: GdnCall):
    device, shapes = call.q.device, call.shapes
    plan = plan_blocks(sequence_lengths(shapes.B, shapes.T, call.cu_seqlens), 1, device)
    qf, kf, vf, gf, bf = (
        plan.to_blocks(x).squeeze(1)  # [steps * sequences, HV, ...]
        for x in _prepare(call.q, call.k, call.v, call.g, call.beta, shapes, call.scale, call.use_qk_l2norm_in_kernel)
    )

    HV, K, V = shapes.HV, shapes.K, shapes.V

    def step(sl: slice, s: torch.Tensor):
        n = s.shape[0] * HV
        s = s.reshape(n, K, V) * gf[sl].exp().reshape(n, 1, 1)
        k_t = kf[sl].reshape(n, 1, K)
        delta = (vf[sl].reshape(n, 1, V) - k_t @ s) * bf[sl].reshape(n, 1, 1)
        s = torch.baddbmm(s, k_t.transpose(1, 2), delta)
        return (qf[sl].reshape(n, 1, K) @ s).view(-1, HV, V), s.view(-1, HV, K, V)

    outs, final = _run_steps(plan, _start_state(call.initial_state, shapes, plan, device), step)
    o = plan.to_tokens(torch.cat(outs).unsqueeze(1))
    o = o.reshape(shapes.B, shapes.T, shapes.HV, shapes.V).to(call.v.dtype)
    return o, (final if call.output_final_state else None)


def fused_recurrent_gated_delta_rule_update(call: PoolDecodeCall):
    """Decode against a state pool: rows with index -1 are skipped (output zeros, pool untouched).
    Reaching here without the host checks, a slot out of range or repeated gives its sequence NaN
    outputs and leaves its slot untouched, and offsets out of order do so for every sequence."""
    q, v, shapes, ssm_pool = call.q, call.v, call.shapes, call.ssm_pool
    if call.cu_seqlens is not None and not offsets_in_order(call.cu_seqlens.tolist(), shapes.T):
        return torch.full_like(v, float("nan"))
    rows = pool_rows(call.ssm_indices.tolist(), ssm_pool.shape[0])
    slots = rows.kept
    lengths = sequence_lengths(shapes.B, shapes.T, call.cu_seqlens)
    starts = [sum(lengths[:n]) for n in range(len(lengths))]
    o = v.new_zeros(shapes.B, shapes.T, shapes.HV, shapes.V)
    for n in rows.refused:
        o.view(shapes.B * shapes.T, shapes.HV, shapes.V)[starts[n] : starts[n] + lengths[n]] = float("nan")
    # A live sequence without tokens leaves its pool slot as it is: nothing to run for it.
    live = [n for n, slot in enumerate(slots) if slot >= 0 and lengths[n] > 0]
    if not live:
        return o
    token_idx = torch.tensor(
        [starts[n] + t for n in live for t in range(lengths[n])], dtype=torch.long, device=q.device
    )
    live_lengths = [lengths[n] for n in live]
    live_slots = torch.tensor([slots[n] for n in live], dtype=torch.long, device=q.device)

    def live_tokens(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(shapes.B * shapes.T, *x.shape[2:]).index_select(0, token_idx).unsqueeze(0)

    total = int(token_idx.numel())
    sub = GdnShapes(1, total, shapes.H, shapes.HV, shapes.K, shapes.V, len(live))
    cu = torch.tensor([0, *torch.tensor(live_lengths).cumsum(0).tolist()], device=q.device)
    out, final = fused_recurrent_gated_delta_rule(
        GdnCall(
            *(live_tokens(x) for x in (q, call.k, v, call.g, call.beta)),
            shapes=sub,
            scale=call.scale,
            initial_state=ssm_pool.index_select(0, live_slots),
            output_final_state=True,
            cu_seqlens=cu,
            use_qk_l2norm_in_kernel=call.use_qk_l2norm_in_kernel,
        )
    )
    with torch.no_grad():
        ssm_pool.index_copy_(0, live_slots, final.to(ssm_pool.dtype))
    flat = o.view(shapes.B * shapes.T, shapes.HV, shapes.V)
    return flat.index_copy(0, token_idx, out.squeeze(0)).view_as(o)
