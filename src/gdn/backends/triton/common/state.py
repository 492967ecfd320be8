"""The sequential passes over chunks, parallel over (sequence x value head, V slice); each program keeps
its [K, BV] slice of the state (or of its gradient) in fp32 registers.

Forward, chunk c entering with state S (stored as h[c]):
    v_new = u - w S,   S <- exp(G_last) S + (k exp(G_last - G))^T v_new.
Backward, dS the gradient w.r.t. the state leaving chunk c (stored as dh[c]):
    dv = dv_local + exp(G_last - G) (k dS),
    dS <- exp(G_last) dS + scale (q exp(G))^T do - w^T dv,
which after the first chunk is the initial state's gradient.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import cdiv, device_guard
from gdn.backends.triton.chunk_index import ChunkPlan
from gdn.backends.triton.common.config import CHUNK, Tiles, state_slice
from gdn.backends.triton.common.tiles import INTERPRET, cast_as, locate_sequence, masked_exp, mma
from gdn.backends.triton.compile_ahead import launch


@triton.jit
def _fwd_step(
    S,
    i_t,
    k,
    w,
    u,
    gc,
    h,
    T_n,
    o_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """One chunk; the pointers are offset to the sequence's first token and chunk, and the head."""
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, KP)
    mk, mv = o_k < K, o_v < V
    tl.store(h + i_t * HV * K * V + o_k[:, None] * V + o_v[None, :], cast_as(S, h), mask=mk[:, None] & mv[None, :])
    rows = i_t * BT + o_t
    mt = rows < T_n
    m_tv = mt[:, None] & mv[None, :]
    wt = tl.load(w + rows[:, None] * HV * K + o_k[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
    p_u = u + rows[:, None] * HV * V + o_v[None, :]
    v_new = tl.load(p_u, mask=m_tv, other=0.0).to(tl.float32) - mma(wt, cast_as(S, k), FP32_DOT)
    tl.store(p_u, cast_as(v_new, u), mask=m_tv)

    G = tl.load(gc + rows * HV, mask=mt, other=0.0)
    G_last = tl.load(gc + (tl.minimum(i_t * BT + BT, T_n) - 1) * HV)
    v_dec = v_new * masked_exp(G_last - G, mt)[:, None]
    kT = tl.load(k + rows[None, :] * H * K + o_k[:, None], mask=mt[None, :] & mk[:, None], other=0.0)
    return S * tl.exp(G_last) + mma(kT, cast_as(v_dec, k), FP32_DOT)


@triton.jit(do_not_specialize=["T", "IS_VARLEN"])
def _state_fwd_kernel(
    k,
    w,
    u,
    gc,
    h,
    h0,
    ht,
    cu_seqlens,
    chunk_offsets,
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    BV: tl.constexpr,
    USE_H0: tl.constexpr,
    STORE_HT: tl.constexpr,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    """Writes h[c] (the state entering chunk c) and v_new over u (same rows, same program)."""
    i_nh, i_v = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, T_n, boc = locate_sequence(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    o_k = tl.arange(0, KP)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    kv = o_k[:, None] * V + o_v[None, :]
    bos = bos.to(tl.int64)
    k += (bos * H + i_h) * K
    w += (bos * HV + i_hv) * K
    u += (bos * HV + i_hv) * V
    gc += bos * HV + i_hv
    h += (boc * HV + i_hv).to(tl.int64) * K * V

    S = tl.zeros([KP, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + i_nh.to(tl.int64) * K * V + kv, mask=m_kv, other=0.0).to(tl.float32)
    NT = tl.cdiv(T_n, BT)
    if INTERPRET:  # Triton < 3.9 interprets a runtime range() bound with int(ndarray), which numpy 2.4 rejects
        i_t = 0
        while i_t < NT:
            S = _fwd_step(S, i_t, k, w, u, gc, h, T_n, o_v, H, HV, K, V, BT, KP, FP32_DOT)
            i_t += 1
    else:
        for i_t in range(0, NT):
            S = _fwd_step(S, i_t, k, w, u, gc, h, T_n, o_v, H, HV, K, V, BT, KP, FP32_DOT)
    if STORE_HT:
        tl.store(ht + i_nh.to(tl.int64) * K * V + kv, S, mask=m_kv)


@triton.jit
def _bwd_step(
    dS,
    i_t,
    q,
    k,
    w,
    gc,
    do,
    dv,
    dh,
    scale,
    T_n,
    o_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """One chunk, in reverse order; pointers offset as in _fwd_step."""
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, KP)
    mk, mv = o_k < K, o_v < V
    tl.store(dh + i_t * HV * K * V + o_k[:, None] * V + o_v[None, :], cast_as(dS, dh), mask=mk[:, None] & mv[None, :])
    rows = i_t * BT + o_t
    mt = rows < T_n
    m_tv = mt[:, None] & mv[None, :]
    m_kt = mk[:, None] & mt[None, :]
    G = tl.load(gc + rows * HV, mask=mt, other=0.0)
    G_last = tl.load(gc + (tl.minimum(i_t * BT + BT, T_n) - 1) * HV)

    kt = tl.load(k + rows[:, None] * H * K + o_k[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
    p_dv = dv + rows[:, None] * HV * V + o_v[None, :]
    dv_t = mma(kt, cast_as(dS, k), FP32_DOT) * masked_exp(G_last - G, mt)[:, None]
    dv_t += tl.load(p_dv, mask=m_tv, other=0.0).to(tl.float32)
    tl.store(p_dv, cast_as(dv_t, dv), mask=m_tv)

    qT = tl.load(q + rows[None, :] * H * K + o_k[:, None], mask=m_kt, other=0.0)
    qT = cast_as(qT.to(tl.float32) * (scale * masked_exp(G, mt))[None, :], k)
    wT = tl.load(w + rows[None, :] * HV * K + o_k[:, None], mask=m_kt, other=0.0)
    do_t = tl.load(do + rows[:, None] * HV * V + o_v[None, :], mask=m_tv, other=0.0)
    return dS * tl.exp(G_last) + mma(qT, do_t, FP32_DOT) - mma(wT, cast_as(dv_t, k), FP32_DOT)


@triton.jit(do_not_specialize=["T", "IS_VARLEN"])
def _state_bwd_kernel(
    q,
    k,
    w,
    gc,
    do,
    dv,
    dh,
    dht,
    dh0,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    BV: tl.constexpr,
    USE_DHT: tl.constexpr,
    STORE_DH0: tl.constexpr,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    """Writes dh[c] (gradient w.r.t. the state leaving chunk c) and the full dv over the local dv."""
    i_nh, i_v = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    i_h = i_hv // (HV // H)
    bos, T_n, boc = locate_sequence(i_n, T, cu_seqlens, chunk_offsets, BT, IS_VARLEN)
    o_k = tl.arange(0, KP)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    kv = o_k[:, None] * V + o_v[None, :]
    bos = bos.to(tl.int64)
    q += (bos * H + i_h) * K
    k += (bos * H + i_h) * K
    w += (bos * HV + i_hv) * K
    gc += bos * HV + i_hv
    do += (bos * HV + i_hv) * V
    dv += (bos * HV + i_hv) * V
    dh += (boc * HV + i_hv).to(tl.int64) * K * V

    dS = tl.zeros([KP, BV], dtype=tl.float32)
    if USE_DHT:
        dS += tl.load(dht + i_nh.to(tl.int64) * K * V + kv, mask=m_kv, other=0.0).to(tl.float32)
    NT = tl.cdiv(T_n, BT)
    if INTERPRET:  # see _state_fwd_kernel
        i_t = NT - 1
        while i_t >= 0:
            dS = _bwd_step(dS, i_t, q, k, w, gc, do, dv, dh, scale, T_n, o_v, H, HV, K, V, BT, KP, FP32_DOT)
            i_t -= 1
    else:
        for i_t in range(NT - 1, -1, -1):
            dS = _bwd_step(dS, i_t, q, k, w, gc, do, dv, dh, scale, T_n, o_v, H, HV, K, V, BT, KP, FP32_DOT)
    if STORE_DH0:
        tl.store(dh0 + i_nh.to(tl.int64) * K * V + kv, dS, mask=m_kv)


def state_forward(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    gc: torch.Tensor,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> (h [chunks, HV, K, V] entering states in k's dtype, v_new (written over u), final state fp32)."""
    T, H, K = k.shape[1:]
    HV, V = u.shape[2], u.shape[3]
    N = plan.num_sequences
    h = torch.empty(plan.num_chunks, HV, K, V, dtype=k.dtype, device=k.device)
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=k.device) if output_final_state else None
    bv = state_slice(tiles, N * HV, V, k.device)
    with device_guard(k):
        launch(_state_fwd_kernel, (N * HV, cdiv(V, bv)))(
            k,
            w,
            u,
            gc,
            h,
            initial_state,
            ht,
            plan.cu_seqlens,
            plan.chunk_offsets,
            T,
            H=H,
            HV=HV,
            K=K,
            V=V,
            BT=CHUNK,
            KP=tiles.KP,
            BV=bv,
            USE_H0=initial_state is not None,
            STORE_HT=output_final_state,
            IS_VARLEN=int(plan.is_varlen),
            FP32_DOT=fp32_dot,
            num_warps=tiles.state_warps,
            num_stages=tiles.state_stages,
        )
    return h, u, ht


def state_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    gc: torch.Tensor,
    do: torch.Tensor,
    dv_local: torch.Tensor,
    dht: torch.Tensor | None,
    want_dh0: bool,
    scale: float,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> (dh [chunks, HV, K, V] fp32, dv (written over dv_local), dh0 fp32 or None).

    dh stays fp32: it carries the final state's gradient, and its bf16 rounding was the largest error
    in the gate gradient (tokens near the end of a sequence)."""
    T, H, K = k.shape[1:]
    HV, V = do.shape[2], do.shape[3]
    N = plan.num_sequences
    dh = torch.empty(plan.num_chunks, HV, K, V, dtype=torch.float32, device=k.device)
    dh0 = torch.empty(N, HV, K, V, dtype=torch.float32, device=k.device) if want_dh0 else None
    bv = state_slice(tiles, N * HV, V, k.device)
    with device_guard(k):
        launch(_state_bwd_kernel, (N * HV, cdiv(V, bv)))(
            q,
            k,
            w,
            gc,
            do,
            dv_local,
            dh,
            dht,
            dh0,
            plan.cu_seqlens,
            plan.chunk_offsets,
            scale,
            T,
            H=H,
            HV=HV,
            K=K,
            V=V,
            BT=CHUNK,
            KP=tiles.KP,
            BV=bv,
            USE_DHT=dht is not None,
            STORE_DH0=want_dh0,
            IS_VARLEN=int(plan.is_varlen),
            FP32_DOT=fp32_dot,
            num_warps=tiles.state_warps,
            num_stages=tiles.state_stages,
        )
    return dh, dv_local, dh0
