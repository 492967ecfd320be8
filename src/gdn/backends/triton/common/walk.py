"""The backward as one reverse walk per (sequence x value head, V slice), for Hopper: what the state
backward, qk_grads and the WY backward do in three passes over memory, each chunk's share formed in
the step that has its state gradient on chip, so that dh, dw, v_new and the local dv never go to memory.

Per chunk (rows of a V slice s; S the state entering the chunk, read from the recomputed h; dS the
gradient w.r.t. the state leaving it, held in fp32 across chunks):

    x = beta (v - exp(G) k S),  v_new = T x                     (the forward's own products, T = (I + A)^-1)
    dv_new = scale P^T do + exp(G_last - G) k dS,  z = T^T dv_new
    dv = beta z                                                  (final: v enters through u = T (beta v))
    dS <- exp(G_last) dS + scale (q exp(G))^T do - k^T (beta exp(G) z)        (w^T dv_new, w never formed)
    dq_s = scale exp(G) do S^T + dP k,  dP = scale (do v_new^T) . exp(G_i - G_j), causal
    dk_s = exp(G_last - G) v_new dS^T + dP^T q - beta exp(G) z S^T
    dT_s = dv_new x^T                                            (T's gradient: dw (beta exp(G) k)^T + du (beta v)^T)
    dbeta_s = rowsum(z (v - exp(G) k S)),  dG_s = q.dq_s - k.dk_s(without its last term) - beta exp(G) rowsum(z k S)
                                                                 (+ exp(G_last) <S, dS> + ... at the last row)

Each of these is a sum over V of the slice's part, so a program writes its parts (dq, dk per value head and
slice, dT, dbeta and dG), and the group reduce (one program per chunk and q/k head) sums them, forms dA
= -T^T dT T^T from the whole dT and its terms (as the WY backward does), applies the l2norm's backward
and the gate's reverse cumsum, and writes dq, dk, dbeta and dg. The walk reads h (recomputed by the
forward's state pass from T, v and beta: no WU kernel), q, k, v, do, T, beta and the gates once per
slice, and writes dv and the parts.

Used where config.fused_walk_applies (Hopper, 16-bit inputs, K and V up to 128, whole sequences); the
portable kernels (state, qk_grads, wy_bwd) serve everything else.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import cdiv, device_guard
from gdn.backends.triton.chunk_index import ChunkPlan
from gdn.backends.triton.common.config import CHUNK, Tiles
from gdn.backends.triton.common.state import state_forward_states
from gdn.backends.triton.common.tiles import (
    INTERPRET,
    cast_as,
    chunk_gates,
    locate_chunk,
    locate_segment,
    masked_exp,
    mma,
    refused,
    within,
)
from gdn.backends.triton.common.wy_bwd import decay_terms, reverse_cumsum, through_inverse
from gdn.backends.triton.l2norm import grad_rows
from gdn.backends.triton.launch import launch


@triton.jit
def _half_grads(
    dS,
    dS_k,
    S,
    qh,
    kh,
    do_t,
    do_g,
    vn,
    dP,
    zb,
    eG,
    er,
    rows,
    m_tk,
    dq_part,
    dk_part,
    o_kh,
    scale,
    G_last,
    HV: tl.constexpr,
    K: tl.constexpr,
    NV: tl.constexpr,
    DS_SPLIT: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """One half of K (columns o_kh; S, dS, dS_k its rows, qh and kh its columns): its parts of dq and
    dk, formed and stored (no elementwise work on them: the gate's terms come from [BT, BT] and
    [BT, BV] tiles in _walk_step) -> (its state gradient entering the chunk, its share of
    exp(G_last) <S, dS>)."""
    p_tk = rows[:, None] * HV * NV * K + o_kh[None, :]
    dq = mma(do_t, tl.trans(S), FP32_DOT) * (scale * eG)[:, None] + mma(dP, kh, FP32_DOT)
    tl.store(dq_part + p_tk, cast_as(dq, dq_part), mask=m_tk)
    if DS_SPLIT:
        lo = cast_as(dS - dS_k.to(tl.float32), dk_part)
        dk = (mma(vn, tl.trans(dS_k), FP32_DOT) + mma(vn, tl.trans(lo), FP32_DOT)) * er[:, None]
    else:
        dk = mma(vn, tl.trans(dS_k), FP32_DOT) * er[:, None]
    dk += mma(tl.trans(dP), qh, FP32_DOT) - mma(zb, tl.trans(S), FP32_DOT)
    tl.store(dk_part + p_tk, cast_as(dk, dk_part), mask=m_tk)
    S_dS = tl.sum(tl.sum(S.to(tl.float32) * dS, 1), 0) * tl.exp(G_last)
    dS_in = dS * tl.exp(G_last) + mma(tl.trans(qh), do_g, FP32_DOT) - mma(tl.trans(kh), zb, FP32_DOT)
    return dS_in, S_dS


@triton.jit
def _walk_step(
    dS_a,
    dS_b,
    q,
    k,
    v,
    beta,
    gc,
    Ai,
    h,
    do,
    dv,
    dq_part,
    dk_part,
    dT_part,
    dbg_part,
    scale,
    n,
    o_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    BV: tl.constexpr,
    NV: tl.constexpr,
    DS_SPLIT: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """One chunk of n rows, in reverse order, the pointers at its first row (h at its state, the parts at
    the program's slice) -> the gradient w.r.t. the state entering it (in its two halves of K), and the
    pointers moved to the chunk before. K is taken in two halves throughout, so that no [BT, K] fp32
    accumulator is ever whole (dq's and dk's parts are formed and stored a half at a time), and the
    gate's gradient is formed from [BT, BT] and [BT, BV] tiles alone:
        q.dq = scale exp(G) rowsum(do . q S) + rowsum(dP_raw . P),
        k.dk (its state and output terms) = exp(G_last - G) rowsum(v_new . k dS) + colsum(dP_raw . P)
    with P = scale (q k^T) . exp(G_i - G_j) and dP_raw = do v_new^T. DS_SPLIT (a call with a final
    state, whose gradient dS carries): dS's products with v_new in two half-precision dots (hi + lo,
    about 16 bits), as qk_grads takes an fp32 dh."""
    KH: tl.constexpr = KP // 2
    o_a = tl.arange(0, KH)
    o_b = KH + o_a
    m_a = within(o_a, K, KH)
    m_b = o_b < K
    mv = within(o_v, V, BV)
    rows, mt, G, G_last = chunk_gates(gc, n, HV, BT)
    # a row offset the compiler cannot prove constant: the [BT, *] offset tiles below are then formed in
    # the step, where they are used, rather than hoisted out of the loop and held in registers throughout
    rows += tl.minimum(n, 0)
    m_tv = mt[:, None] & mv[None, :]
    causal = (rows[:, None] >= rows[None, :]) & mt[:, None]
    eG = masked_exp(G, mt)
    er = masked_exp(G_last - G, mt)
    b = tl.load(beta + rows * HV, mask=mt, other=0.0).to(tl.float32)
    p_a = rows[:, None] * H * K + o_a[None, :]
    p_b = rows[:, None] * H * K + o_b[None, :]
    ka = tl.load(k + p_a, mask=mt[:, None] & m_a[None, :], other=0.0)
    kb = tl.load(k + p_b, mask=mt[:, None] & m_b[None, :], other=0.0)
    qa = tl.load(q + p_a, mask=mt[:, None] & m_a[None, :], other=0.0)
    qb = tl.load(q + p_b, mask=mt[:, None] & m_b[None, :], other=0.0)
    A = tl.load(Ai + rows[:, None] * HV * BT + rows[None, :], mask=mt[:, None], other=0.0)
    Sa = tl.load(h + o_a[:, None] * V + o_v[None, :], mask=m_a[:, None] & mv[None, :], other=0.0)
    Sb = tl.load(h + o_b[:, None] * V + o_v[None, :], mask=m_b[:, None] & mv[None, :], other=0.0)
    p_tv = rows[:, None] * HV * V + o_v[None, :]
    do_t = tl.load(do + p_tv, mask=m_tv, other=0.0)

    # the chunk's v_new as the forward formed it, T (beta (v - exp(G) k S))
    kS = mma(ka, Sa, FP32_DOT) + mma(kb, Sb, FP32_DOT)
    y = tl.load(v + p_tv, mask=m_tv, other=0.0).to(tl.float32) - eG[:, None] * kS
    x = cast_as(b[:, None] * y, k)
    vn = cast_as(mma(A, x, FP32_DOT), k)
    dSa_k = cast_as(dS_a, k)
    dSb_k = cast_as(dS_b, k)

    # v_new's gradient, then through T: v's (final) and T's part of this slice
    qk = mma(qa, tl.trans(ka), FP32_DOT) + mma(qb, tl.trans(kb), FP32_DOT)
    P = cast_as(qk * (scale * masked_exp(G[:, None] - G[None, :], causal)), k)
    kdS = (mma(ka, dSa_k, FP32_DOT) + mma(kb, dSb_k, FP32_DOT)) * er[:, None]
    dvn = cast_as(mma(tl.trans(P), do_t, FP32_DOT) + kdS, k)
    z = mma(tl.trans(A), dvn, FP32_DOT)
    tl.store(dv + p_tv, cast_as(z * b[:, None], dv), mask=m_tv)
    dbeta = tl.sum(z * y, 1)
    # the gate's gradient: through w's exp(G), then q.dq and k.dk as the docstring forms them
    qS = mma(qa, Sa, FP32_DOT) + mma(qb, Sb, FP32_DOT)
    k_dk = tl.sum(vn.to(tl.float32) * kdS, 1)
    dG = (scale * eG) * tl.sum(do_t.to(tl.float32) * qS, 1) - k_dk - (b * eG) * tl.sum(z * kS, 1)
    tl.store(dT_part + rows[:, None] * HV * NV * BT + rows[None, :], mma(dvn, tl.trans(x), FP32_DOT), mask=mt[:, None])
    zb = cast_as(z * (b * eG)[:, None], k)
    dP_raw = mma(do_t, tl.trans(vn), FP32_DOT)
    W = dP_raw * P.to(tl.float32)
    dG += tl.sum(W, 1) - tl.sum(W, 0)
    dP = cast_as(dP_raw * (scale * masked_exp(G[:, None] - G[None, :], causal)), k)

    # dq's and dk's parts and the state gradient entering the chunk, a half of K at a time
    do_g = cast_as(do_t.to(tl.float32) * (scale * eG)[:, None], k)
    dS_a, S_dS_a = _half_grads(
        dS_a, dSa_k, Sa, qa, ka, do_t, do_g, vn, dP, zb, eG, er, rows, mt[:, None] & m_a[None, :],
        dq_part, dk_part, o_a, scale, G_last, HV, K, NV, DS_SPLIT, FP32_DOT,
    )  # fmt: skip
    dS_b, S_dS_b = _half_grads(
        dS_b, dSb_k, Sb, qb, kb, do_t, do_g, vn, dP, zb, eG, er, rows, mt[:, None] & m_b[None, :],
        dq_part, dk_part, o_b, scale, G_last, HV, K, NV, DS_SPLIT, FP32_DOT,
    )  # fmt: skip
    dG += tl.where(rows == tl.minimum(BT, n) - 1, S_dS_a + S_dS_b + tl.sum(k_dk, 0), 0.0)
    p_bg = dbg_part + rows * HV * NV * 2
    tl.store(p_bg, dbeta, mask=mt)
    tl.store(p_bg + 1, dG, mask=mt)
    back = -BT
    return (
        dS_a,
        dS_b,
        q + back * H * K,
        k + back * H * K,
        v + back * HV * V,
        beta + back * HV,
        gc + back * HV,
        Ai + back * HV * BT,
        h - HV * K * V,
        do + back * HV * V,
        dv + back * HV * V,
        dq_part + back * HV * NV * K,
        dk_part + back * HV * NV * K,
        dT_part + back * HV * NV * BT,
        dbg_part + back * HV * NV * 2,
    )


@triton.jit(do_not_specialize=["T", "NSEG", "SEG", "IS_VARLEN", "HAS_START", "STORE_END"])
def _reverse_walk_kernel(
    q,
    k,
    v,
    beta,
    gc,
    Ai,
    h,
    do,
    dv,
    dq_parts,
    dk_parts,
    dT_parts,
    dbg_parts,
    start,
    end,
    bad_offsets,
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
    NV: tl.constexpr,
    HAS_START,
    STORE_END,
    IS_VARLEN,
    DS_SPLIT: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """Walks a sequence's chunks from the last, from the final state's gradient (start, or zero), for one
    value head and V slice: dv and the parts (module docstring); end: the initial state's gradient."""
    i_nh, i_v = tl.program_id(0), tl.program_id(1)
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)
    bos, T_s, boc = locate_segment(i_nh // HV, T, NSEG, SEG, bounds, chunk_offsets, BT, IS_VARLEN)
    o_v = i_v * BV + tl.arange(0, BV)
    NT = tl.cdiv(T_s, BT)
    # 64-bit pointers at the segment's last chunk
    last = (bos + (NT - 1) * BT).to(tl.int64)
    q += (last * H + i_h) * K
    k += (last * H + i_h) * K
    v += (last * HV + i_hv) * V
    do += (last * HV + i_hv) * V
    dv += (last * HV + i_hv) * V
    beta += last * HV + i_hv
    gc += last * HV + i_hv
    Ai += (last * HV + i_hv) * BT
    h += ((boc + NT - 1) * HV + i_hv).to(tl.int64) * K * V
    dq_parts += ((last * HV + i_hv) * NV + i_v) * K
    dk_parts += ((last * HV + i_hv) * NV + i_v) * K
    dT_parts += ((last * HV + i_hv) * NV + i_v) * BT
    dbg_parts += ((last * HV + i_hv) * NV + i_v) * 2

    KH: tl.constexpr = KP // 2
    o_a = tl.arange(0, KH)
    dS_a = tl.zeros([KH, BV], dtype=tl.float32)
    dS_b = tl.zeros([KH, BV], dtype=tl.float32)
    m_a = (o_a < K)[:, None] & (o_v < V)[None, :]
    m_b = (KH + o_a < K)[:, None] & (o_v < V)[None, :]
    kv_a = o_a[:, None] * V + o_v[None, :]
    kv_b = kv_a + KH * V
    if HAS_START != 0:
        dS_a += tl.load(start + i_nh.to(tl.int64) * K * V + kv_a, mask=m_a, other=0.0).to(tl.float32)
        dS_b += tl.load(start + i_nh.to(tl.int64) * K * V + kv_b, mask=m_b, other=0.0).to(tl.float32)
    dS_a = refused(dS_a, bad_offsets, IS_VARLEN)  # refused offsets (chunk_index): every gradient NaN
    dS_b = refused(dS_b, bad_offsets, IS_VARLEN)
    if INTERPRET:  # Triton < 3.9 interprets a runtime range() bound with int(ndarray), which numpy 2.4 rejects
        i_t = NT - 1
        while i_t >= 0:
            dS_a, dS_b, q, k, v, beta, gc, Ai, h, do, dv, dq_parts, dk_parts, dT_parts, dbg_parts = _walk_step(
                dS_a, dS_b, q, k, v, beta, gc, Ai, h, do, dv, dq_parts, dk_parts, dT_parts, dbg_parts, scale,
                T_s - i_t * BT, o_v, H, HV, K, V, BT, KP, BV, NV, DS_SPLIT, FP32_DOT,
            )  # fmt: skip
            i_t -= 1
    else:
        for i_t in range(NT - 1, -1, -1):
            dS_a, dS_b, q, k, v, beta, gc, Ai, h, do, dv, dq_parts, dk_parts, dT_parts, dbg_parts = _walk_step(
                dS_a, dS_b, q, k, v, beta, gc, Ai, h, do, dv, dq_parts, dk_parts, dT_parts, dbg_parts, scale,
                T_s - i_t * BT, o_v, H, HV, K, V, BT, KP, BV, NV, DS_SPLIT, FP32_DOT,
            )  # fmt: skip
    if STORE_END != 0:
        tl.store(end + i_nh.to(tl.int64) * K * V + kv_a, dS_a, mask=m_a)
        tl.store(end + i_nh.to(tl.int64) * K * V + kv_b, dS_b, mask=m_b)


@triton.jit(do_not_specialize=["T", "IS_VARLEN"])
def _group_reduce_kernel(
    q,
    k,
    beta,
    gc,
    Ai,
    dq_parts,
    dk_parts,
    dT_parts,
    dbg_parts,
    dq,
    dk,
    dbeta,
    dg,
    q_rstd,
    k_rstd,
    cu_seqlens,
    chunk_indices,
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    NV: tl.constexpr,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
    L2NORM: tl.constexpr,
):
    """One chunk and q/k head: per value head of the group, T's whole gradient (the slices' parts summed)
    through T = (I + A)^-1 (dA = -T^T dT T^T, times A's decay) into dbeta, the gate's gradient (reverse
    cumsum over the chunk) and dk's A part (dA beta + (dA beta)^T) k, summed over the group first; then
    dq and dk, the group's and slices' parts summed, through the l2norm's backward with L2NORM."""
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_t, bos, T_n = locate_chunk(i_c, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    if i_t * BT >= T_n:  # a grid row past its sequence's chunks (tiles.locate_chunk)
        return
    o_t = tl.arange(0, BT)
    mt = i_t * BT + o_t < T_n
    tok = (bos + i_t * BT + o_t).to(tl.int64)
    o_k = tl.arange(0, KP)
    m_tk = mt[:, None] & (o_k < K)[None, :]
    p_qk = (tok * H + i_h)[:, None] * K + o_k[None, :]
    kt = tl.load(k + p_qk, mask=m_tk, other=0.0)
    kk = mma(kt, tl.trans(kt), FP32_DOT)
    dAs = tl.zeros([BT, BT], dtype=tl.float32)
    for i_g in range(HV // H):
        i_hv = i_h * (HV // H) + i_g
        b = tl.load(beta + tok * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
        G = tl.load(gc + tok * HV + i_hv, mask=mt, other=0.0)
        A = tl.load(Ai + (tok * HV + i_hv)[:, None] * BT + o_t[None, :], mask=mt[:, None], other=0.0)
        AT = tl.trans(A)
        dT = tl.zeros([BT, BT], dtype=tl.float32)
        db = tl.zeros([BT], dtype=tl.float32)
        dG = tl.zeros([BT], dtype=tl.float32)
        for i_s in range(NV):
            at = (tok * HV + i_hv) * NV + i_s
            dT += tl.load(dT_parts + at[:, None] * BT + o_t[None, :], mask=mt[:, None], other=0.0)
            db += tl.load(dbg_parts + at * 2, mask=mt, other=0.0)
            dG += tl.load(dbg_parts + at * 2 + 1, mask=mt, other=0.0)
        dA = through_inverse(dT, AT, G, o_t, mt, k, FP32_DOT)
        dAs += dA * b[:, None]
        db_A, dG_A = decay_terms(dA, kk, b)
        db += db_A
        dG += dG_A
        tl.store(dg + tok * HV + i_hv, reverse_cumsum(dG, o_t, mt), mask=mt)
        tl.store(dbeta + tok * HV + i_hv, db, mask=mt)

    dk_t = mma(cast_as(dAs + tl.trans(dAs), k), kt, FP32_DOT)
    dq_t = tl.zeros([BT, KP], dtype=tl.float32)
    for i_g in range(HV // H):
        for i_s in range(NV):
            at = ((tok * HV + i_h * (HV // H) + i_g) * NV + i_s)[:, None] * K + o_k[None, :]
            dk_t += tl.load(dk_parts + at, mask=m_tk, other=0.0).to(tl.float32)
            dq_t += tl.load(dq_parts + at, mask=m_tk, other=0.0).to(tl.float32)
    if L2NORM:
        dk_t = grad_rows(kt, dk_t, tl.load(k_rstd + tok * H + i_h, mask=mt, other=0.0))
        dq_t = grad_rows(
            tl.load(q + p_qk, mask=m_tk, other=0.0), dq_t, tl.load(q_rstd + tok * H + i_h, mask=mt, other=0.0)
        )
    tl.store(dk + p_qk, cast_as(dk_t, dk), mask=m_tk)
    tl.store(dq + p_qk, cast_as(dq_t, dq), mask=m_tk)


def walk_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    gc: torch.Tensor,
    Ai: torch.Tensor,
    initial_state: torch.Tensor | None,
    do: torch.Tensor,
    dht: torch.Tensor | None,
    want_dh0: bool,
    scale: float,
    rstd: tuple[torch.Tensor, torch.Tensor] | None,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
    exact_dot: str,
) -> tuple[torch.Tensor, ...]:
    """The backward over a whole (unsplit) plan: h recomputed from T, v and beta, the reverse walk, the
    group reduce -> (dq, dk in q's and k's dtype, through the l2norm's backward where rstd is given;
    dv in v's dtype; dbeta, dg fp32; dh0 fp32 or None). rstd: (q's, k's) 1 / norm per row."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    h = state_forward_states(k, v, beta, Ai, gc, initial_state, plan, tiles, fp32_dot, exact_dot)
    NV = cdiv(V, tiles.fused_bv)
    rows = B * T
    dv = torch.empty_like(v)
    dq_parts = torch.empty(rows, HV, NV, K, dtype=k.dtype, device=k.device)
    dk_parts = torch.empty_like(dq_parts)
    dT_parts = torch.empty(rows, HV, NV, CHUNK, dtype=torch.float32, device=k.device)
    dbg_parts = torch.empty(rows, HV, NV, 2, dtype=torch.float32, device=k.device)
    dh0 = torch.empty(plan.num_sequences, HV, K, V, dtype=torch.float32, device=k.device) if want_dh0 else None
    segments = plan.segments()
    absent = torch.empty(0, dtype=torch.float32, device=k.device)
    with device_guard(k):
        launch(_reverse_walk_kernel, (segments.count * HV, NV))(
            q,
            k,
            v,
            beta,
            gc,
            Ai,
            h,
            do,
            dv,
            dq_parts,
            dk_parts,
            dT_parts,
            dbg_parts,
            absent if dht is None else dht,
            absent if dh0 is None else dh0,
            plan.bad_offsets,
            segments.bounds,
            segments.chunk_offsets,
            segments.per_sequence,
            segments.tokens,
            scale,
            T,
            H=H,
            HV=HV,
            K=K,
            V=V,
            BT=CHUNK,
            KP=tiles.KP,
            BV=tiles.fused_bv,
            NV=NV,
            HAS_START=int(dht is not None),
            STORE_END=int(dh0 is not None),
            IS_VARLEN=int(plan.is_varlen),
            DS_SPLIT=dht is not None,
            FP32_DOT=fp32_dot,
            num_warps=tiles.fused_warps,
            num_stages=tiles.fused_stages,
        )
        del h  # before the reduce allocates dq and dk
        dq = torch.empty(B, T, H, K, dtype=q.dtype, device=k.device)
        dk = torch.empty(B, T, H, K, dtype=k.dtype, device=k.device)
        dbeta = torch.empty(B, T, HV, dtype=torch.float32, device=k.device)
        dg = torch.empty_like(dbeta)
        q_rstd, k_rstd = (None, None) if rstd is None else rstd
        launch(_group_reduce_kernel, (plan.num_chunks, H))(
            q,
            k,
            beta,
            gc,
            Ai,
            dq_parts,
            dk_parts,
            dT_parts,
            dbg_parts,
            dq,
            dk,
            dbeta,
            dg,
            q_rstd,
            k_rstd,
            plan.cu_seqlens,
            plan.chunk_indices,
            T,
            H=H,
            HV=HV,
            K=K,
            BT=CHUNK,
            KP=tiles.KP,
            NV=NV,
            IS_VARLEN=int(plan.is_varlen),
            FP32_DOT=fp32_dot,
            L2NORM=rstd is not None,
            num_warps=tiles.reduce_warps,
            num_stages=tiles.num_stages,
        )
    return dq, dk, dv, dbeta, dg, dh0
