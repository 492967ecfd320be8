"""The backward's reverse state pass with the chunk gradients folded in (`Tiles.fused_reverse`): one
program per segment and value head walks its chunks from the last, holding the whole [K, V] gradient
dS w.r.t. the state leaving the chunk in fp32 registers, and forms there what `state.state_backward`
and `qk_grads` form apart:

    dv  = dv_local + exp(G_last - G) (k dS)
    dq  = scale exp(G) (do S^T) + dP k,            dP = scale (do v_new^T) . exp(G_i - G_j), causal
    dk  = exp(G_last - G) (v_new dS^T) + dP^T q
    dw  = -dv S^T
    dG_i = q_i.dq_i - k_i.dk_i, plus at the chunk's last row
           exp(G_last) <S, dS> + sum_i k_i.(exp(G_last - G_i) dS v_new_i)
    dS <- exp(G_last) dS + scale (q exp(G))^T do - w^T dv

with S the state entering the chunk (the recomputed forward's h). Each of dq, dk, dw and dG contracts
over all of V, so a program that holds a slice of V could only form partial sums; holding all of it,
the program writes no per-chunk dS (only the gradient entering each segment, as the sliced pass). dq
and dk come out per value head: the WY backward sums dk's over each query/key head's group, the caller
dq's.

Split sequences go through `state.reverse_state_pass` as the sliced pass does: the segments' summaries
and the combine give each segment the gradient leaving it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton.chunk_index import ChunkPlan
from gdn.backends.triton.common.config import Tiles
from gdn.backends.triton.common.state import chunk_gates, reverse_state_pass
from gdn.backends.triton.common.tiles import INTERPRET, cast_as, locate_segment, masked_exp, mma, mma_acc


@triton.jit
def _reverse_step(
    dS,
    q,
    k,
    w,
    gc,
    do,
    dv,
    h,
    v_new,
    dq,
    dk,
    dw,
    dG,
    scale,
    i_t,
    T_s,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    VP: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """Chunk i_t of a segment of T_s rows, every pointer at the segment's first row (h at its first
    chunk's state) -> the gradient w.r.t. the state entering the chunk. dv holds the local dv and gets
    the full one. The pointers move to the chunk as 64-bit scalars; the offsets within it are 32-bit
    blocks (64-bit ones of every [BT, K] and [BT, V] tile cost as many registers again)."""
    t0 = (i_t * BT).to(tl.int64)
    q, k = q + t0 * H * K, k + t0 * H * K
    w, dw, dq, dk = w + t0 * HV * K, dw + t0 * HV * K, dq + t0 * HV * K, dk + t0 * HV * K
    do, dv, v_new = do + t0 * HV * V, dv + t0 * HV * V, v_new + t0 * HV * V
    gc, dG, h = gc + t0 * HV, dG + t0 * HV, h + i_t.to(tl.int64) * HV * K * V
    n = T_s - i_t * BT
    o_k = tl.arange(0, KP)
    o_v = tl.arange(0, VP)
    mk = o_k < K
    mv = o_v < V
    rows, mt, G, G_last = chunk_gates(gc, n, HV, BT)
    last = tl.minimum(BT, n) - 1
    m_tk = mt[:, None] & mk[None, :]
    m_tv = mt[:, None] & mv[None, :]
    p_qk = rows[:, None] * H * K + o_k[None, :]
    p_wk = rows[:, None] * HV * K + o_k[None, :]
    p_tv = rows[:, None] * HV * V + o_v[None, :]
    decay = masked_exp(G_last - G, mt)

    # First everything that reads dS, the gradient leaving the chunk, so that it is updated (and the
    # old one dead) before the chunk's [BT, K] gradients are formed: fewer live registers.
    kt = tl.load(k + p_qk, mask=m_tk, other=0.0)
    dS_in = cast_as(dS, k)
    dv_t = mma(kt, dS_in, FP32_DOT) * decay[:, None]
    dv_t += tl.load(dv + p_tv, mask=m_tv, other=0.0).to(tl.float32)
    dv_neg = cast_as(-dv_t, k)  # negated in fp32: the interpreter negates half-precision bit patterns
    tl.store(dv + p_tv, cast_as(dv_t, dv), mask=m_tv)
    vn = tl.load(v_new + p_tv, mask=m_tv, other=0.0)
    if k.dtype.element_ty == tl.float32:
        dk_t = mma(vn, tl.trans(dS), FP32_DOT)
    else:  # dS is fp32 (it carries the final-state gradient): hi + lo half dots keep ~16 bits of it
        dS_lo = cast_as(dS - dS_in.to(tl.float32), k)
        dk_t = mma_acc(vn, tl.trans(dS_lo), mma(vn, tl.trans(dS_in), FP32_DOT), FP32_DOT)
    dk_t *= decay[:, None]
    S = tl.load(h + o_k[:, None] * V + o_v[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
    dG_last = tl.sum(tl.sum(S.to(tl.float32) * dS, 1), 0) * tl.exp(G_last)
    dG_last += tl.sum(tl.sum(dk_t * kt.to(tl.float32), 1), 0)
    qt = tl.load(q + p_qk, mask=m_tk, other=0.0)
    do_t = tl.load(do + p_tv, mask=m_tv, other=0.0)
    wt = tl.load(w + p_wk, mask=m_tk, other=0.0)
    eG = scale * masked_exp(G, mt)
    qs = cast_as(qt.to(tl.float32) * eG[:, None], k)
    dS = mma_acc(tl.trans(qs), do_t, dS * tl.exp(G_last), FP32_DOT)
    dS = mma_acc(tl.trans(wt), dv_neg, dS, FP32_DOT)

    ST = tl.trans(S)
    tl.store(dw + p_wk, cast_as(mma(dv_neg, ST, FP32_DOT), dw), mask=m_tk)
    causal = (rows[:, None] >= rows[None, :]) & mt[:, None]
    dp = cast_as(mma(do_t, tl.trans(vn), FP32_DOT) * scale * masked_exp(G[:, None] - G[None, :], causal), k)
    dq_t = mma_acc(dp, kt, mma(do_t, ST, FP32_DOT) * eG[:, None], FP32_DOT)
    dk_t = mma_acc(tl.trans(dp), qt, dk_t, FP32_DOT)
    tl.store(dq + p_wk, dq_t, mask=m_tk)
    tl.store(dk + p_wk, dk_t, mask=m_tk)
    dG_t = tl.sum(dq_t * qt.to(tl.float32), 1) - tl.sum(dk_t * kt.to(tl.float32), 1)
    tl.store(dG + rows * HV, dG_t + tl.where(rows == last, dG_last, 0.0), mask=mt)
    return dS


@triton.jit(do_not_specialize=["T", "NSEG", "SEG", "IS_VARLEN", "HAS_START", "STORE_END"])
def _reverse_kernel(
    q,
    k,
    w,
    gc,
    do,
    dv,
    h,
    v_new,
    dq,
    dk,
    dw,
    dG,
    start,
    end,
    bounds,
    chunk_offsets,
    NSEG,
    SEG,
    scale,
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    BV: tl.constexpr,
    HAS_START,
    STORE_END,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    """From the gradient w.r.t. the state leaving each segment (start, or zero): the full dv over the
    local dv, dq and dk per value head, dw and dG; end: the gradient w.r.t. the state entering each
    segment. BV is all of V, padded."""
    i_sh = tl.program_id(0)
    i_hv = i_sh % HV
    i_h = i_hv // (HV // H)
    bos, T_s, boc = locate_segment(i_sh // HV, T, NSEG, SEG, bounds, chunk_offsets, BT, IS_VARLEN)
    o_k = tl.arange(0, KP)
    o_v = tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    kv = o_k[:, None] * V + o_v[None, :]
    bos = bos.to(tl.int64)
    q += (bos * H + i_h) * K
    k += (bos * H + i_h) * K
    w += (bos * HV + i_hv) * K
    dq += (bos * HV + i_hv) * K
    dk += (bos * HV + i_hv) * K
    dw += (bos * HV + i_hv) * K
    gc += bos * HV + i_hv
    dG += bos * HV + i_hv
    do += (bos * HV + i_hv) * V
    dv += (bos * HV + i_hv) * V
    v_new += (bos * HV + i_hv) * V
    h += (boc * HV + i_hv).to(tl.int64) * K * V

    dS = tl.zeros([KP, BV], dtype=tl.float32)
    if HAS_START != 0:
        dS += tl.load(start + i_sh.to(tl.int64) * K * V + kv, mask=m_kv, other=0.0).to(tl.float32)
    NT = tl.cdiv(T_s, BT)
    if INTERPRET:  # see state._state_fwd_kernel
        i_t = NT - 1
        while i_t >= 0:
            dS = _reverse_step(
                dS, q, k, w, gc, do, dv, h, v_new, dq, dk, dw, dG, scale, i_t, T_s, H, HV, K, V, BT, KP, BV, FP32_DOT
            )
            i_t -= 1
    else:
        for i_t in range(NT - 1, -1, -1):
            dS = _reverse_step(
                dS, q, k, w, gc, do, dv, h, v_new, dq, dk, dw, dG, scale, i_t, T_s, H, HV, K, V, BT, KP, BV, FP32_DOT
            )
    if STORE_END != 0:
        tl.store(end + i_sh.to(tl.int64) * K * V + kv, dS, mask=m_kv)


def reverse_pass(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    gc: torch.Tensor,
    do: torch.Tensor,
    dv_local: torch.Tensor,
    h: torch.Tensor,
    v_new: torch.Tensor,
    dht: torch.Tensor | None,
    want_dh0: bool,
    scale: float,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
    exact_dot: str,
    maps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """h, v_new: the recomputed forward's (state_forward). -> (dq, dk [B, T, HV, K] fp32 per value head
    (dk without the WY part), dv (written over dv_local), dw [B, T, HV, K] in k's dtype, dG [B, T, HV, 1]
    fp32, dh0 fp32 or None); maps as in state.state_backward."""
    B, T, HV, V = do.shape
    K = k.shape[3]
    dq = torch.empty(B, T, HV, K, dtype=torch.float32, device=k.device)
    dk = torch.empty_like(dq)
    dw = torch.empty(B, T, HV, K, dtype=k.dtype, device=k.device)
    dG = torch.empty(B, T, HV, 1, dtype=torch.float32, device=k.device)
    dh0 = torch.empty(plan.num_sequences, HV, K, V, dtype=torch.float32, device=k.device) if want_dh0 else None
    reverse_state_pass(
        _reverse_kernel,
        (q, k, w, gc, do, dv_local),
        (h, v_new, dq, dk, dw, dG),
        dht,
        dh0,
        scale,
        plan,
        tiles,
        fp32_dot,
        exact_dot,
        maps,
        whole_values=True,
    )
    return dq, dk, dv_local, dw, dG, dh0
