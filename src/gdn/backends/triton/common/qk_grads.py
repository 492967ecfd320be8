"""Backward through the output and the state update of each chunk, one program per (chunk, K slice,
value head):

    dq = scale exp(G) (do S^T) + dP k,            dP = scale (do v_new^T) . exp(G_i - G_j), causal
    dk = exp(G_last - G) (v_new dS^T) + dP^T q
    dw = -dv S^T                                  (v_new = u - w S)
    dG_i = q_i.dq_i - k_i.dk_i, plus at the chunk's last row
           exp(G_last) <S, dS> + sum_i k_i.(exp(G_last - G_i) dS v_new_i)

S is the state entering the chunk, dS the gradient w.r.t. the state leaving it, dv the full value
gradient from the backward state pass. dq and dk come out per value head, in k's dtype, in blocks of
PB elements per (chunk, value head), dq's [BT, K] rows first, then dk's; the WY backward sums them
over each query/key head's group. With the whole K in one slice (K <= 128), a program holds three
[64, K] accumulators and reads v_new, do and dv once: summing the group in registers as well took
five, which spilled at K = 128 and split K in two, each slice reading them and forming dP again. dG
(w.r.t. the cumulative gate) is written per K slice; the WY backward adds the slices, its own part,
and turns it into dg.

With the whole K in one slice a program is the only one to read its chunk's rows of v_new and its
block of dS, and reads all of them before it writes (a barrier between). So where the two parts fit
in a block of dS (K = V = 128 with dS in k's dtype, a training call's: exactly) they are written over
it, and dw over v_new where both are [T, HV, K] in one dtype: three [T, HV, K] tensors fewer at the
backward's peak, which is here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import cdiv, device_guard
from gdn.backends.triton.chunk_index import ChunkPlan
from gdn.backends.triton.common.config import CHUNK, Tiles, narrow_slice_warps, stage_constants
from gdn.backends.triton.common.tiles import cast_as, chunk_rows, locate_chunk, masked_exp, mma
from gdn.backends.triton.launch import launch


@triton.jit(do_not_specialize=["T", "IS_VARLEN"])
def _qk_grads_kernel(
    q,
    k,
    v_new,
    h,
    dh,
    gc,
    do,
    dv,
    parts,
    dw,
    dG,
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
    NK: tl.constexpr,
    PB: tl.constexpr,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    i_c, i_k, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    i_t, bos, T_n = locate_chunk(i_c, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    if i_t * BT >= T_n:  # a grid row past its sequence's chunks (tiles.locate_chunk)
        return
    o_t, mt, tok = chunk_rows(i_t, bos, T_n, BT)
    last = tl.minimum(BT, T_n - i_t * BT) - 1
    o_k = i_k * BK + tl.arange(0, BK)
    mk = o_k < K
    m_tk = mt[:, None] & mk[None, :]
    causal = (o_t[:, None] >= o_t[None, :]) & mt[:, None]
    state = (i_c * HV + i_hv).to(tl.int64) * K * V
    G = tl.load(gc + tok * HV + i_hv, mask=mt, other=0.0)
    G_last = tl.load(gc + (bos + i_t * BT + last).to(tl.int64) * HV + i_hv)

    dq_g = tl.zeros([BT, BK], dtype=tl.float32)
    dk_g = tl.zeros([BT, BK], dtype=tl.float32)
    dw_g = tl.zeros([BT, BK], dtype=tl.float32)
    dp = tl.zeros([BT, BT], dtype=tl.float32)
    s_dot_ds = tl.zeros([BK], dtype=tl.float32)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        mv = o_v < V
        m_vk = mv[:, None] & mk[None, :]
        ST = tl.load(h + state + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.0)
        dST = tl.load(dh + state + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.0)
        m_tv = mt[:, None] & mv[None, :]
        p_tv = (tok * HV + i_hv)[:, None] * V + o_v[None, :]
        vn = tl.load(v_new + p_tv, mask=m_tv, other=0.0)
        do_t = tl.load(do + p_tv, mask=m_tv, other=0.0)
        dv_t = tl.load(dv + p_tv, mask=m_tv, other=0.0)
        dq_g += mma(do_t, ST, FP32_DOT)
        if dh.dtype.element_ty == k.dtype.element_ty:
            dk_g += mma(vn, dST, FP32_DOT)
        else:  # fp32 dS of half inputs (it carries the final-state gradient): hi + lo half dots keep ~16 bits
            dS_hi = cast_as(dST, k)
            dk_g += mma(vn, dS_hi, FP32_DOT) + mma(vn, cast_as(dST - dS_hi.to(tl.float32), k), FP32_DOT)
        dw_g += mma(dv_t, ST, FP32_DOT)
        dp += mma(do_t, tl.trans(vn), FP32_DOT)
        s_dot_ds += tl.sum(ST.to(tl.float32) * dST.to(tl.float32), 0)

    # every warp's reads of v_new and dS are done before any warp writes over them
    tl.debug_barrier()
    # q and k are loaded only now, to keep them out of the V loop's registers
    p_qk = (tok * H + i_h)[:, None] * K + o_k[None, :]
    qt = tl.load(q + p_qk, mask=m_tk, other=0.0)
    kt = tl.load(k + p_qk, mask=m_tk, other=0.0)
    dq_g *= (scale * masked_exp(G, mt))[:, None]
    dk_g *= masked_exp(G_last - G, mt)[:, None]
    dG_last = tl.sum(s_dot_ds, 0) * tl.exp(G_last) + tl.sum(tl.sum(dk_g * kt.to(tl.float32), 1), 0)
    p_hk = (tok * HV + i_hv)[:, None] * K + o_k[None, :]
    tl.store(dw + p_hk, cast_as(-dw_g, dw), mask=m_tk)

    dp = cast_as(dp * scale * masked_exp(G[:, None] - G[None, :], causal), k)
    dq_g += mma(dp, kt, FP32_DOT)
    dk_g += mma(tl.trans(dp), qt, FP32_DOT)
    dG_t = tl.sum(dq_g * qt.to(tl.float32), 1) - tl.sum(dk_g * kt.to(tl.float32), 1)
    dG_t += tl.where(o_t == last, dG_last, 0.0)
    tl.store(dG + (tok * HV + i_hv) * NK + i_k, dG_t, mask=mt)
    part = (i_c * HV + i_hv).to(tl.int64) * PB + o_t[:, None] * K + o_k[None, :]
    tl.store(parts + part, cast_as(dq_g, parts), mask=m_tk)
    tl.store(parts + BT * K + part, cast_as(dk_g, parts), mask=m_tk)


def qk_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v_new: torch.Tensor,
    h: torch.Tensor,
    dh: torch.Tensor,
    gc: torch.Tensor,
    do: torch.Tensor,
    dv: torch.Tensor,
    scale: float,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dh is in k's dtype or fp32. -> (dq and dk per value head in k's dtype, [num_chunks, HV, PB]: a
    chunk's [BT, K] rows of dq, then of dk, in each block (dk without the WY part); dw [B, T, HV, K] in
    k's dtype; dG [B, T, HV, NK] fp32 per K slice). The parts may be written over dh and dw over v_new
    (the module's docstring says where): neither is to be read after."""
    B, T, H, K = q.shape
    HV, V = do.shape[2], do.shape[3]
    # an fp32 dh (a call that outputs its final state, or fp32 inputs) takes 64-column slices: the whole
    # K spilled 216 bytes with bf16 inputs and asked for 245,760 bytes of shared memory with fp32 ones
    # (ptxas, sm_90; an H200 SM has 232,448)
    bk = tiles.qk_grads_bk if dh.dtype != torch.float32 else min(tiles.qk_grads_bk, 64)
    NK = cdiv(K, bk)
    dh_block = K * V * dh.element_size() // k.element_size()  # a chunk's state gradient, in k's elements
    if NK == 1 and dh_block >= 2 * CHUNK * K and dh.is_contiguous():
        parts, PB = dh.view(-1).view(k.dtype).view(plan.num_chunks, HV, dh_block), dh_block
    else:
        PB = 2 * CHUNK * K
        parts = torch.empty(plan.num_chunks, HV, PB, dtype=k.dtype, device=q.device)
    over_v_new = NK == 1 and v_new.shape == (B, T, HV, K) and v_new.dtype == k.dtype and v_new.is_contiguous()
    dw = v_new if over_v_new else torch.empty(B, T, HV, K, dtype=k.dtype, device=q.device)
    dG = torch.empty(B, T, HV, NK, dtype=torch.float32, device=q.device)
    with device_guard(q):
        launch(_qk_grads_kernel, (plan.num_chunks, NK, HV))(
            q,
            k,
            v_new,
            h,
            dh,
            gc,
            do,
            dv,
            parts,
            dw,
            dG,
            plan.cu_seqlens,
            plan.chunk_indices,
            scale,
            T,
            **stage_constants(plan, tiles, fp32_dot, H=H, HV=HV, K=K, V=V),
            BK=bk,
            BV=tiles.BV,
            NK=NK,
            PB=PB,
            num_warps=narrow_slice_warps(tiles.dqkwg_warps, bk, tiles.BV),
        )
    return parts, dw, dG
