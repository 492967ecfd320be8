"""The chunk-parallel products with the causal in-chunk attention P = tril(q k^T exp(G_i - G_j)):

- forward output  o = scale (q exp(G) S + P v_new),  S the state entering the chunk (where the forward's
  state pass does not write it itself: state.writes_output);
- the local value gradient of the backward  dv_local = scale P^T do  (the state part is added by the
  backward state pass).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import cdiv, device_guard
from gdn.backends.triton.chunk_index import ChunkPlan
from gdn.backends.triton.common.config import Tiles, stage_constants
from gdn.backends.triton.common.tiles import cast_as, chunk_rows, locate_chunk, masked_exp, mma
from gdn.backends.triton.launch import launch


@triton.jit(do_not_specialize=["T", "IS_VARLEN"])
def _output_kernel(
    q,
    k,
    v_new,
    h,
    gc,
    o,
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    i_c, i_v, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    i_t, bos, T_n = locate_chunk(i_c, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    if i_t * BT >= T_n:  # a grid row past its sequence's chunks (tiles.locate_chunk)
        return
    o_t, mt, tok = chunk_rows(i_t, bos, T_n, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    mv = o_v < V
    h_base = h + (i_c * HV + i_hv).to(tl.int64) * K * V

    acc = tl.zeros([BT, BV], dtype=tl.float32)
    s = tl.zeros([BT, BT], dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        mk = o_k < K
        qt = tl.load(q + (tok * H + i_h)[:, None] * K + o_k[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
        kT = tl.load(k + (tok * H + i_h)[None, :] * K + o_k[:, None], mask=mt[None, :] & mk[:, None], other=0.0)
        St = tl.load(h_base + o_k[:, None] * V + o_v[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
        acc += mma(qt, St, FP32_DOT)
        s += mma(qt, kT, FP32_DOT)
    G = tl.load(gc + tok * HV + i_hv, mask=mt, other=0.0)
    acc *= masked_exp(G, mt)[:, None]
    causal = (o_t[:, None] >= o_t[None, :]) & mt[:, None]
    s *= masked_exp(G[:, None] - G[None, :], causal)
    m_tv = mt[:, None] & mv[None, :]
    vt = tl.load(v_new + (tok * HV + i_hv)[:, None] * V + o_v[None, :], mask=m_tv, other=0.0)
    acc += mma(cast_as(s, k), vt, FP32_DOT)
    tl.store(o + (tok * HV + i_hv)[:, None] * V + o_v[None, :], cast_as(acc * scale, o), mask=m_tv)


@triton.jit(do_not_specialize=["T", "IS_VARLEN"])
def _dv_local_kernel(
    q,
    k,
    gc,
    do,
    dv,
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    i_t, bos, T_n = locate_chunk(i_c, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    if i_t * BT >= T_n:  # a grid row past its sequence's chunks (tiles.locate_chunk)
        return
    o_t, mt, tok = chunk_rows(i_t, bos, T_n, BT)

    sT = tl.zeros([BT, BT], dtype=tl.float32)  # sT[j, i] = k_j . q_i
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        mk = o_k < K
        kt = tl.load(k + (tok * H + i_h)[:, None] * K + o_k[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
        qT = tl.load(q + (tok * H + i_h)[None, :] * K + o_k[:, None], mask=mt[None, :] & mk[:, None], other=0.0)
        sT += mma(kt, qT, FP32_DOT)
    G = tl.load(gc + tok * HV + i_hv, mask=mt, other=0.0)
    causal = (o_t[:, None] <= o_t[None, :]) & mt[None, :]
    pT = cast_as(sT * masked_exp(G[None, :] - G[:, None], causal) * scale, k)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        m_tv = mt[:, None] & (o_v < V)[None, :]
        p = (tok * HV + i_hv)[:, None] * V + o_v[None, :]
        dv_t = mma(pT, tl.load(do + p, mask=m_tv, other=0.0), FP32_DOT)
        tl.store(dv + p, cast_as(dv_t, dv), mask=m_tv)


def chunk_output(
    q: torch.Tensor,
    k: torch.Tensor,
    v_new: torch.Tensor,
    h: torch.Tensor,
    gc: torch.Tensor,
    scale: float,
    out_dtype: torch.dtype,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
) -> torch.Tensor:
    B, T, H, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    o = torch.empty(B, T, HV, V, dtype=out_dtype, device=q.device)
    with device_guard(q):
        launch(_output_kernel, (plan.num_chunks, cdiv(V, tiles.output_bv), HV))(
            q,
            k,
            v_new,
            h,
            gc,
            o,
            plan.cu_seqlens,
            plan.chunk_indices,
            scale,
            T,
            **stage_constants(plan, tiles, fp32_dot, H=H, HV=HV, K=K, V=V),
            BK=tiles.BK,
            BV=tiles.output_bv,
            num_warps=tiles.output_warps,
        )
    return o


def dv_local(
    q: torch.Tensor,
    k: torch.Tensor,
    gc: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
) -> torch.Tensor:
    """scale P^T do [B, T, HV, V] in k's dtype."""
    T, H, K = q.shape[1:]
    HV = do.shape[2]
    dv = torch.empty(do.shape, dtype=k.dtype, device=k.device)
    with device_guard(q):
        launch(_dv_local_kernel, (plan.num_chunks, HV))(
            q,
            k,
            gc,
            do,
            dv,
            plan.cu_seqlens,
            plan.chunk_indices,
            scale,
            T,
            **stage_constants(plan, tiles, fp32_dot, H=H, HV=HV, K=K, V=do.shape[3]),
            BK=tiles.BK,
            BV=tiles.BV,
            num_warps=tiles.dv_warps,
        )
    return dv
