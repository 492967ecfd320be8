"""Stand-in math of fla_npu's chunked gated-delta-rule AscendC ops (NOT the real kernels).

Each function takes the real op's arguments and computes its contract in fp32, chunk by chunk:

    v_new = u - w S,   S' = exp(g_last) S + (k exp(g_last - g))^T v_new,
    o = scale (q exp(g) S + ((q k^T) * exp(g_i - g_j), j <= i) v_new),
    u = A (beta v),    w = A (beta exp(g) k),    A = (I + L)^-1,  L_ij = beta_i k_i.k_j exp(g_i - g_j), j < i,

with g the chunk-local cumsum of the log decay. The backward ops return the partial gradients that
the decomposed backward adds up (dqkwg: through the chunk's own q, k, g with v_new and the states
fixed; wy_repr_bwd_*: through u, w and A); the backward ones use autograd on the chunk's forward.

Layouts are the ops' head-first ones: q, k [B, H, T, K]; v, u, v_new, d_o [B, HV, T, V];
w [B, HV, T, K]; g, beta [B, HV, T]; A [B, HV, T, C] (row t holds its chunk's row of (I + L)^-1);
h [B, HV, NT, K, V]; states [N, HV, K, V]. Varlen: B = 1 with cu_seqlens and chunk_indices as host
int lists (flattened [sequence, chunk] pairs); the tiling rejects empty sequences.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from standins import _checks as check

DEFAULT_CHUNK = 64
COMPOSITE_K = 128
COMPOSITE_V = (128, 256)


@dataclass(frozen=True)
class Chunk:
    row: int  # batch row
    seq: int  # sequence: the state row
    index: int  # position along h's chunk axis
    start: int
    end: int


def plan(op: str, batch: int, length: int, size: int, cu_seqlens, chunk_indices) -> tuple[list[Chunk], int, int]:
    """The chunks in the ops' order, the length of h's chunk axis and the number of sequences."""
    cu = None if cu_seqlens is None else list(cu_seqlens)
    indices = None if chunk_indices is None else list(chunk_indices)
    if cu is None:
        if indices is not None:
            raise RuntimeError(f"{op}: chunk_indices given without cu_seqlens")
        per_row = math.ceil(length / size)
        chunks = [Chunk(b, b, c, c * size, min(length, (c + 1) * size)) for b in range(batch) for c in range(per_row)]
        return chunks, per_row, batch
    if batch != 1:
        raise RuntimeError(f"{op}: varlen inputs need batch 1, got {batch}")
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != length:
        raise RuntimeError(f"{op}: cu_seqlens {cu} must run from 0 to T = {length}")
    lengths = [b - a for a, b in itertools.pairwise(cu)]
    for n, size_n in enumerate(lengths):
        if size_n <= 0:
            raise RuntimeError(f"{op}: seqlens[{n + 1}] should be larger than seqlens[{n}] (cu_seqlens {cu})")
    expected = [v for n, size_n in enumerate(lengths) for c in range(math.ceil(size_n / size)) for v in (n, c)]
    if indices is not None and indices != expected:
        raise RuntimeError(f"{op}: chunk_indices {indices} do not match cu_seqlens {cu} (expected {expected})")
    chunks = []
    for pair in range(len(expected) // 2):
        n, c = expected[2 * pair], expected[2 * pair + 1]
        start = cu[n] + c * size
        chunks.append(Chunk(0, n, pair, start, min(cu[n + 1], start + size)))
    return chunks, len(chunks), len(lengths)


def _value_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """[H, L, D] at the query/key heads -> [HV, L, D]: value head j reads key head j // group."""
    return x.repeat_interleave(group, dim=0) if group > 1 else x


def _decay(gc: torch.Tensor, strict: bool) -> torch.Tensor:
    """[HV, L] chunk-local cumsum -> [HV, L, L] exp(g_i - g_j) for j <= i (j < i when strict), else 0."""
    size = gc.shape[-1]
    mask = torch.ones(size, size, dtype=torch.bool, device=gc.device).tril(-1 if strict else 0)
    return torch.where(mask, gc.unsqueeze(-1) - gc.unsqueeze(-2), float("-inf")).exp()


def _kkt(kc: torch.Tensor, bc: torch.Tensor, gc: torch.Tensor) -> torch.Tensor:
    """L = beta_i k_i.k_j exp(g_i - g_j) for j < i: [HV, L, L]."""
    return (kc @ kc.transpose(-1, -2)) * _decay(gc, strict=True) * bc.unsqueeze(-1)


def _inverse(strict_lower: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(strict_lower.shape[-1], dtype=strict_lower.dtype, device=strict_lower.device)
    return torch.linalg.solve_triangular(eye + strict_lower, eye.expand_as(strict_lower), upper=False)


def _heads(op: str, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int]:
    """(B, H, T, HV) of head-first k [B, H, T, K] and a value-side tensor [B, HV, T, ...]."""
    B, H, T, _ = k.shape
    if v.shape[0] != B or v.shape[2] != T or v.shape[1] % H:
        raise RuntimeError(f"{op}: value tensor {tuple(v.shape)} does not match k {tuple(k.shape)} (head-first)")
    return B, H, T, v.shape[1]


def npu_recompute_w_u_fwd(k, v, beta, A, chunk_size, *, g=None, gk=None, cu_seqlens=None, chunk_indices=None):
    op = "npu_recompute_w_u_fwd"
    check.not_modelled(op, gk=gk)
    B, H, T, HV = _heads(op, k, v)
    chunks, _, _ = plan(op, B, T, chunk_size, cu_seqlens, chunk_indices)
    w = torch.empty(B, HV, T, k.shape[3], dtype=k.dtype, device=k.device)
    u = torch.empty_like(v)
    for c in chunks:
        at = (c.row, slice(None), slice(c.start, c.end))
        size = c.end - c.start
        a = A[at][..., :size].float()
        b = beta[at].float().unsqueeze(-1)
        u[at] = (a @ (v[at].float() * b)).to(u.dtype)
        kc = _value_heads(k[at].float(), HV // H)
        w[at] = (a @ (kc * b * g[at].exp().unsqueeze(-1))).to(w.dtype)
    return w, u


def npu_chunk_gated_delta_rule_fwd_h(
    k,
    w,
    u,
    g=None,
    *,
    gk=None,
    initial_state=None,
    output_final_state=False,
    chunk_size=None,
    cu_seqlens=None,
    chunk_indices=None,
    state_v_first=False,
):
    op = "npu_chunk_gated_delta_rule_fwd_h"
    check.not_modelled(op, gk=gk, state_v_first=state_v_first)
    if g is None:
        raise RuntimeError(f"{op}: either g or gk must be provided.")
    size = chunk_size or DEFAULT_CHUNK
    B, H, T, HV = _heads(op, k, u)
    K, V = k.shape[3], u.shape[3]
    chunks, num_chunks, N = plan(op, B, T, size, cu_seqlens, chunk_indices)
    h = torch.empty(B, HV, num_chunks, K, V, dtype=k.dtype, device=k.device)
    v_new = torch.empty_like(u)
    final = torch.zeros(N, HV, K, V, dtype=torch.float32, device=k.device)
    state, seq = None, None
    for c in chunks:
        if c.seq != seq:
            if seq is not None:
                final[seq] = state
            seq = c.seq
            state = final[seq].clone() if initial_state is None else initial_state[seq].float()
        at = (c.row, slice(None), slice(c.start, c.end))
        h[c.row, :, c.index] = state.to(h.dtype)
        vn = u[at].float() - w[at].float() @ state
        v_new[at] = vn.to(v_new.dtype)
        gc = g[at]
        last = gc[:, -1:]
        kc = _value_heads(k[at].float(), HV // H) * (last - gc).exp().unsqueeze(-1)
        state = state * last.exp().unsqueeze(-1) + kc.transpose(-1, -2) @ vn
    final[seq] = state
    if not output_final_state:
        return h, v_new, None
    return h, v_new, final if initial_state is None else final.to(initial_state.dtype)


def npu_chunk_fwd_o(
    q, k, v, h, scale, *, g=None, g_gamma=None, cu_seqlens=None, chunk_indices=None, chunk_size=None, **ignored
):
    op = "npu_chunk_fwd_o"
    check.not_modelled(op, g_gamma=g_gamma, **ignored)
    B, H, T, HV = _heads(op, k, v)
    chunks, _, _ = plan(op, B, T, chunk_size or DEFAULT_CHUNK, cu_seqlens, chunk_indices)
    o = torch.empty_like(v)
    for c in chunks:
        at = (c.row, slice(None), slice(c.start, c.end))
        gc = g[at]
        qc = _value_heads(q[at].float(), HV // H)
        kc = _value_heads(k[at].float(), HV // H)
        state = h[c.row, :, c.index].float()
        intra = (qc @ kc.transpose(-1, -2)) * _decay(gc, strict=False)
        o[at] = (scale * ((qc * gc.exp().unsqueeze(-1)) @ state + intra @ v[at].float())).to(o.dtype)
    return o


def npu_chunk_bwd_dv_local(
    q, k, d_o, g, scale, chunk_size, *, g_gamma=None, A=None, cu_seqlens=None, chunk_indices=None
):
    # A is accepted as the op accepts it; the GDN local dv does not read it.
    op = "npu_chunk_bwd_dv_local"
    check.not_modelled(op, g_gamma=g_gamma)
    B, H, T, HV = _heads(op, k, d_o)
    chunks, _, _ = plan(op, B, T, chunk_size, cu_seqlens, chunk_indices)
    dv = torch.empty_like(d_o)
    for c in chunks:
        at = (c.row, slice(None), slice(c.start, c.end))
        qc = _value_heads(q[at].float(), HV // H)
        kc = _value_heads(k[at].float(), HV // H)
        local = scale * (qc @ kc.transpose(-1, -2)) * _decay(g[at], strict=False)
        dv[at] = (local.transpose(-1, -2) @ d_o[at].float()).to(dv.dtype)
    return dv


def npu_chunk_gated_delta_rule_bwd_dhu(
    q,
    k,
    w,
    d_o,
    dv,
    scale,
    chunk_size,
    *,
    g=None,
    gK=None,
    h0=None,
    dht=None,
    cu_seqlens=None,
    chunk_indices=None,
    use_exp2=False,
    transpose_state_layout=False,
):
    op = "npu_chunk_gated_delta_rule_bwd_dhu"
    check.not_modelled(op, gK=gK, use_exp2=use_exp2, transpose_state_layout=transpose_state_layout)
    B, H, T, HV = _heads(op, k, dv)
    K, V = k.shape[3], dv.shape[3]
    chunks, num_chunks, N = plan(op, B, T, chunk_size, cu_seqlens, chunk_indices)
    dh = torch.empty(B, HV, num_chunks, K, V, dtype=q.dtype, device=q.device)
    dh0 = torch.zeros(N, HV, K, V, dtype=torch.float32, device=q.device)
    dv2 = torch.empty_like(dv)
    grad, seq = None, None
    for c in reversed(chunks):
        if c.seq != seq:
            if seq is not None:
                dh0[seq] = grad
            seq = c.seq
            grad = dh0[seq].clone() if dht is None else dht[seq].float()
        at = (c.row, slice(None), slice(c.start, c.end))
        gc = g[at]
        last = gc[:, -1:]
        dh[c.row, :, c.index] = grad.to(dh.dtype)
        kc = _value_heads(k[at].float(), HV // H) * (last - gc).exp().unsqueeze(-1)
        dvc = dv[at].float() + kc @ grad
        dv2[at] = dvc.to(dv2.dtype)
        qc = _value_heads(q[at].float(), HV // H) * gc.exp().unsqueeze(-1)
        grad = (
            grad * last.exp().unsqueeze(-1)
            + scale * qc.transpose(-1, -2) @ d_o[at].float()
            - w[at].float().transpose(-1, -2) @ dvc
        )
    dh0[seq] = grad
    return dh, None if h0 is None else dh0.to(q.dtype), dv2


def npu_chunk_bwd_dqkwg(
    q,
    k,
    v,
    g,
    h,
    dox,
    dh,
    dv,
    chunk_size,
    *,
    cu_seqlens=None,
    chunk_indices=None,
    w=None,
    g_gamma=None,
    scale=None,
    use_exp2=None,
    transpose_state_layout=None,
):
    # w is accepted as the op accepts it; dw follows from dv and the states alone.
    op = "npu_chunk_bwd_dqkwg"
    check.not_modelled(op, g_gamma=g_gamma, use_exp2=use_exp2, transpose_state_layout=transpose_state_layout)
    scale = 1.0 if scale is None else scale
    B, H, T, HV = _heads(op, k, v)
    group = HV // H
    chunks, _, _ = plan(op, B, T, chunk_size, cu_seqlens, chunk_indices)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    dw = torch.empty(B, HV, T, k.shape[3], dtype=q.dtype, device=q.device)
    dg = torch.empty_like(g)
    for c in chunks:
        at = (c.row, slice(None), slice(c.start, c.end))
        state, d_state = h[c.row, :, c.index].float(), dh[c.row, :, c.index].float()
        vn, do = v[at].float(), dox[at].float()
        qh = q[at].float().requires_grad_()
        kh = k[at].float().requires_grad_()
        gc = g[at].clone().requires_grad_()
        with torch.enable_grad():
            qc, kc = _value_heads(qh, group), _value_heads(kh, group)
            last = gc[:, -1:]
            intra = (qc @ kc.transpose(-1, -2)) * _decay(gc, strict=False)
            o = scale * ((qc * gc.exp().unsqueeze(-1)) @ state + intra @ vn)
            leaving = state * last.exp().unsqueeze(-1) + (kc * (last - gc).exp().unsqueeze(-1)).transpose(-1, -2) @ vn
            grads = torch.autograd.grad((o * do).sum() + (leaving * d_state).sum(), (qh, kh, gc))
        dq[at], dk[at], dg[at] = grads[0].to(dq.dtype), grads[1].to(dk.dtype), grads[2]
        dw[at] = (-(dv[at].float() @ state.transpose(-1, -2))).to(dw.dtype)
    return dq, dk, dw, dg


def npu_prepare_wy_repr_bwd_da(k, v, beta, A, dw, du, g, *, chunk_size, cu_seqlens=None, chunk_indices=None):
    op = "npu_prepare_wy_repr_bwd_da"
    B, H, T, HV = _heads(op, k, v)
    chunks, _, _ = plan(op, B, T, chunk_size, cu_seqlens, chunk_indices)
    dA = torch.zeros_like(A)
    for c in chunks:
        at = (c.row, slice(None), slice(c.start, c.end))
        size = c.end - c.start
        a = A[at][..., :size].float()
        b = beta[at].float().unsqueeze(-1)
        kc = _value_heads(k[at].float(), HV // H) * b * g[at].exp().unsqueeze(-1)
        d_inverse = du[at].float() @ (v[at].float() * b).transpose(-1, -2) + dw[at].float() @ kc.transpose(-1, -2)
        d_lower = -(a.transpose(-1, -2) @ d_inverse @ a.transpose(-1, -2))
        dA[(*at, slice(0, size))] = d_lower.tril(-1).to(dA.dtype)
    return dA


def npu_prepare_wy_repr_bwd_full(k, v, beta, A, dA, dw, du, g, chunk_size, *, cu_seqlens=None, chunk_indices=None):
    op = "npu_prepare_wy_repr_bwd_full"
    B, H, T, HV = _heads(op, k, v)
    chunks, _, _ = plan(op, B, T, chunk_size, cu_seqlens, chunk_indices)
    dk, dv, dbeta, dg = torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta), torch.empty_like(g)
    for c in chunks:
        at = (c.row, slice(None), slice(c.start, c.end))
        size = c.end - c.start
        a, d_lower = A[at][..., :size].float(), dA[at][..., :size].float()
        kh = k[at].float().requires_grad_()
        vc = v[at].float().requires_grad_()
        bc = beta[at].float().requires_grad_()
        gc = g[at].clone().requires_grad_()
        with torch.enable_grad():
            kc = _value_heads(kh, HV // H)
            b = bc.unsqueeze(-1)
            u = a @ (vc * b)
            w = a @ (kc * b * gc.exp().unsqueeze(-1))
            lower = _kkt(kc, bc, gc)
            total = (u * du[at].float()).sum() + (w * dw[at].float()).sum() + (lower * d_lower).sum()
            grads = torch.autograd.grad(total, (kh, vc, bc, gc))
        dk[at], dv[at] = grads[0].to(dk.dtype), grads[1].to(dv.dtype)
        dbeta[at], dg[at] = grads[2].to(dbeta.dtype), grads[3].to(dg.dtype)
    return dk, dv, dbeta, dg


def npu_chunk_gated_delta_rule_fwd(
    q,
    k,
    v,
    g,
    beta,
    *,
    initial_state=None,
    output_final_state=False,
    chunk_size=DEFAULT_CHUNK,
    cu_seqlens=None,
    chunk_indices=None,
    scale=None,
    layout="BNSD",
    use_exp2=False,
    use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    disable_recompute=False,
    return_intermediate_states=False,
    state_v_first=False,
):
    """The composite forward: o, final state, the chunk-local cumsum of g and A in one call, in the
    token-major BSND layout: q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV]. Returns the
    ten slots (o, final_state, g_cumsum [B, T, HV] fp32, A [B, HV, T, C], beta_eff, h, q_hat, k_hat,
    q_rstd, k_rstd); g_cumsum and A only with disable_recompute."""
    op = "npu_chunk_gated_delta_rule_fwd"
    if layout != "BSND":
        raise NotImplementedError(f"{op} stand-in: layout {layout!r} is not modelled (BSND only)")
    check.not_modelled(
        op,
        use_exp2=use_exp2,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval,
        return_intermediate_states=return_intermediate_states,
        state_v_first=state_v_first,
    )
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if K != COMPOSITE_K or V not in COMPOSITE_V:
        raise RuntimeError(f"{op}: supports K = {COMPOSITE_K} and V in {set(COMPOSITE_V)}, got K = {K}, V = {V}")
    scale = K**-0.5 if scale is None else scale
    chunks, _, _ = plan(op, B, T, chunk_size, cu_seqlens, chunk_indices)
    g_cumsum = torch.empty(B, T, HV, dtype=torch.float32, device=q.device)
    A = torch.zeros(B, HV, T, chunk_size, dtype=k.dtype, device=k.device)
    for c in chunks:
        tokens = (c.row, slice(c.start, c.end))
        gc = g[tokens].cumsum(0).t()  # [HV, L]
        g_cumsum[tokens] = gc.t()
        kc = _value_heads(k[tokens].float().transpose(0, 1), HV // H)
        A[c.row, :, c.start : c.end, : c.end - c.start] = _inverse(_kkt(kc, beta[tokens].float().t(), gc)).to(A.dtype)
    heads = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    g_h = g_cumsum.transpose(1, 2).contiguous()
    beta_h = beta.transpose(1, 2).float().contiguous()
    lists = dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    w, u = npu_recompute_w_u_fwd(heads[1], heads[2], beta_h, A, chunk_size, g=g_h, **lists)
    h, v_new, final = npu_chunk_gated_delta_rule_fwd_h(
        heads[1],
        w,
        u,
        g_h,
        initial_state=initial_state,
        output_final_state=output_final_state,
        chunk_size=chunk_size,
        **lists,
    )
    o = npu_chunk_fwd_o(heads[0], heads[1], v_new, h, scale, g=g_h, chunk_size=chunk_size, **lists)
    saved = (g_cumsum, A) if disable_recompute else (None, None)
    return (o.transpose(1, 2).contiguous(), final, *saved, None, None, q, k, None, None)
