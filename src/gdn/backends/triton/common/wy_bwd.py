"""Backward through the WY representation and the gate cumsum, one program per (chunk, query/key head)
looping over the head's value heads, then writing dq and dk in one pass over K for the whole group: the
sums over its value heads of their output/state parts (from qk_grads) and dk's WY part.

Where q and k were l2-normalised in the op and that pass holds the whole K (K <= 128), it applies the
normalisation's backward to its fp32 sums and writes dq and dk in q's and k's dtype: without it the
two fp32 [T, H, K] tensors go to memory and a separate l2norm backward reads them back (at (1, 8192)
with 16 heads, 128 MiB written and read again, besides its launches). Wider K takes slices, writes
fp32, and leaves the normalisation's backward to `l2norm_bwd`.

With w = T (beta exp(G) k), u = T (beta v), T = (I + A)^-1, A = beta_i k_i.k_j exp(G_i - G_j) (j < i):
    dT = dw (beta exp(G) k)^T + du (beta v)^T   (lower triangle: T has no other entries)
    dA = -T^T dT T^T                            (strictly lower triangle)
and the gradients through beta, exp(G), K K^T follow; dv, dbeta and dg are final here. dg is the
reverse in-chunk cumsum of the gradient w.r.t. the cumulative gate (G_i = sum of g over t <= i), which
adds the K-slice partials of the output/state part.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import device_guard
from gdn.backends.triton.chunk_index import ChunkPlan
from gdn.backends.triton.common.config import Tiles, narrow_slice_warps, stage_constants
from gdn.backends.triton.common.tiles import cast_as, chunk_rows, locate_chunk, masked_exp, mma
from gdn.backends.triton.l2norm import grad_rows, l2norm_bwd
from gdn.backends.triton.launch import launch


@triton.jit(do_not_specialize=["T", "IS_VARLEN"])
def _wy_bwd_kernel(
    q,
    k,
    v,
    beta,
    gc,
    Ai,
    dw,
    dv,
    parts,
    dq,
    dk,
    dbeta,
    dg,
    dG,
    q_rstd,
    k_rstd,
    cu_seqlens,
    chunk_indices,
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BKO: tl.constexpr,
    NK: tl.constexpr,
    PB: tl.constexpr,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
    L2NORM: tl.constexpr,
):
    """dv holds du (the full value gradient of u) and is overwritten with the gradient of v; parts holds
    each value head's output/state part of the query and key gradients, in qk_grads' blocks of PB
    elements per (chunk, value head): dq's [BT, K] rows, then dk's. dq and dk are
    written in K slices of BKO; with L2NORM (BKO covers K) through the l2norm's backward, for which q
    and k are the normalised ones and q_rstd, k_rstd their rows' 1 / norm."""
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_t, bos, T_n = locate_chunk(i_c, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    if i_t * BT >= T_n:  # a grid row past its sequence's chunks (tiles.locate_chunk)
        return
    o_t, mt, tok = chunk_rows(i_t, bos, T_n, BT)
    lower = o_t[:, None] >= o_t[None, :]

    # The dA part of dk, (dA b + (dA b)^T) k, is linear in the [BT, BT] factor: summed over the value
    # heads here, it costs one pass over k for all of them.
    dAs = tl.zeros([BT, BT], dtype=tl.float32)
    for i_g in range(HV // H):
        i_hv = i_h * (HV // H) + i_g
        b = tl.load(beta + tok * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
        G = tl.load(gc + tok * HV + i_hv, mask=mt, other=0.0)
        A = tl.load(Ai + (tok * HV + i_hv)[:, None] * BT + o_t[None, :], mask=mt[:, None], other=0.0)
        AT = tl.trans(A)
        eG = masked_exp(G, mt)

        # w = T (beta exp(G) k). With P = dw k^T: dT gets P diag(beta exp(G)), and the row sums of
        # (T^T dw) o k, which beta and G need, are the column sums of T o P.
        P = tl.zeros([BT, BT], dtype=tl.float32)
        for k0 in range(0, K, BK):
            o_k = k0 + tl.arange(0, BK)
            m_tk = mt[:, None] & (o_k < K)[None, :]
            kt = tl.load(k + (tok * H + i_h)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
            dwt = tl.load(dw + (tok * HV + i_hv)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
            P += mma(dwt, tl.trans(kt), FP32_DOT)
        dkb_k = tl.sum(A.to(tl.float32) * P, 0) * eG
        db = dkb_k
        dG_t = dkb_k * b
        dT = P * (b * eG)[None, :]

        # u = T (beta v)
        for v0 in range(0, V, BV):
            o_v = v0 + tl.arange(0, BV)
            m_tv = mt[:, None] & (o_v < V)[None, :]
            p_tv = (tok * HV + i_hv)[:, None] * V + o_v[None, :]
            vf = tl.load(v + p_tv, mask=m_tv, other=0.0).to(tl.float32)
            du = tl.load(dv + p_tv, mask=m_tv, other=0.0)
            dT += mma(du, tl.trans(cast_as(vf * b[:, None], k)), FP32_DOT)
            dvb = mma(AT, du, FP32_DOT)
            tl.store(dv + p_tv, cast_as(dvb * b[:, None], dv), mask=m_tv)
            db += tl.sum(dvb * vf, 1)

        # T = (I + A)^-1: dA = -T^T dT T^T on the strictly lower triangle, times the decay of A
        dT = cast_as(tl.where(lower, dT, 0.0), k)
        dA = -mma(cast_as(mma(AT, dT, FP32_DOT), k), AT, FP32_DOT)
        dA *= masked_exp(G[:, None] - G[None, :], (o_t[:, None] > o_t[None, :]) & mt[:, None])
        dAs += dA * b[:, None]
        # K K^T only now (k again, from cache): held from the first K loop it stayed live beside P,
        # dT and dA, and the kernel spilled
        kk = tl.zeros([BT, BT], dtype=tl.float32)
        for k0 in range(0, K, BK):
            o_k = k0 + tl.arange(0, BK)
            m_tk = mt[:, None] & (o_k < K)[None, :]
            kt = tl.load(k + (tok * H + i_h)[:, None] * K + o_k[None, :], mask=m_tk, other=0.0)
            kk += mma(kt, tl.trans(kt), FP32_DOT)
        dAkk = dA * kk
        db += tl.sum(dAkk, 1)
        dAA = dAkk * b[:, None]  # dA_ij * A_ij
        dG_t += tl.sum(dAA, 1) - tl.sum(dAA, 0)

        for i_k in range(NK):
            dG_t += tl.load(dG + (tok * HV + i_hv) * NK + i_k, mask=mt, other=0.0)
        # dg_t = sum of dG_i over the chunk's rows i >= t (padded rows carry zero)
        dg_t = tl.sum(tl.where(o_t[:, None] <= o_t[None, :], tl.where(mt, dG_t, 0.0)[None, :], 0.0), 1)
        tl.store(dg + tok * HV + i_hv, dg_t, mask=mt)
        tl.store(dbeta + tok * HV + i_hv, db, mask=mt)

    # dk = (dA b + (dA b)^T) k + sum over value heads of (their output/state part + diag(beta exp(G))
    # T^T dw); dq = sum over value heads of their part
    dAs = cast_as(dAs + tl.trans(dAs), k)
    chunk_parts = parts + (i_c * HV).to(tl.int64) * PB
    for k0 in range(0, K, BKO):
        o_k = k0 + tl.arange(0, BKO)
        m_tk = mt[:, None] & (o_k < K)[None, :]
        p_rk = o_t[:, None] * K + o_k[None, :]  # a chunk's rows in a block of the parts
        p_qk = (tok * H + i_h)[:, None] * K + o_k[None, :]
        kt = tl.load(k + p_qk, mask=m_tk, other=0.0)
        dk_t = mma(dAs, kt, FP32_DOT)
        # T, beta and G are reloaded per K slice (from cache): keeping every value head's T in
        # registers across this loop would cost more than the loads
        for i_g in range(HV // H):
            i_hv = i_h * (HV // H) + i_g
            b = tl.load(beta + tok * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
            eG = masked_exp(tl.load(gc + tok * HV + i_hv, mask=mt, other=0.0), mt)
            A = tl.load(Ai + (tok * HV + i_hv)[:, None] * BT + o_t[None, :], mask=mt[:, None], other=0.0)
            p_hk = (tok * HV + i_hv)[:, None] * K + o_k[None, :]
            dwt = tl.load(dw + p_hk, mask=m_tk, other=0.0)
            # diag(beta exp(G)) T^T dw with the diagonal on T's columns: the product then adds into dk_t
            # in place (scaled afterwards it needs a [BT, BKO] fp32 tile of its own)
            dk_t += mma(cast_as(tl.trans(A.to(tl.float32) * (b * eG)[None, :]), k), dwt, FP32_DOT)
            dk_t += tl.load(chunk_parts + (i_hv * PB + BT * K) + p_rk, mask=m_tk, other=0.0).to(tl.float32)
        if L2NORM:
            dk_t = grad_rows(kt, dk_t, tl.load(k_rstd + tok * H + i_h, mask=mt, other=0.0))
        tl.store(dk + p_qk, cast_as(dk_t, dk), mask=m_tk)
        # dq after dk is stored, so that the two sums are not live together
        dq_t = tl.zeros([BT, BKO], dtype=tl.float32)
        for i_g in range(HV // H):
            dq_t += tl.load(chunk_parts + (i_h * (HV // H) + i_g) * PB + p_rk, mask=m_tk, other=0.0).to(tl.float32)
        if L2NORM:
            qt = tl.load(q + p_qk, mask=m_tk, other=0.0)
            dq_t = grad_rows(qt, dq_t, tl.load(q_rstd + tok * H + i_h, mask=mt, other=0.0))
        tl.store(dq + p_qk, cast_as(dq_t, dq), mask=m_tk)


def wy_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    gc: torch.Tensor,
    Ai: torch.Tensor,
    dw: torch.Tensor,
    du: torch.Tensor,
    parts: torch.Tensor,
    dG: torch.Tensor,
    rstd: tuple[torch.Tensor, torch.Tensor] | None,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """parts: qk_grads' dq and dk per value head ([num_chunks, HV, PB]); rstd: (q's, k's) 1 / norm per
    row where q and k are the op's l2-normalised ones. -> (dq, dk [B, T, H, K] in q's and k's dtype,
    through the l2norm's backward where rstd is given; dv (written over du), dbeta fp32, dg fp32)."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    in_kernel = rstd is not None and tiles.wy_bwd_out_bk >= K
    # fp32 only where `l2norm_bwd` still has to read them
    final = rstd is None or in_kernel
    dq = torch.empty(B, T, H, K, dtype=q.dtype if final else torch.float32, device=k.device)
    dk = torch.empty(B, T, H, K, dtype=k.dtype if final else torch.float32, device=k.device)
    dbeta = torch.empty(B, T, HV, dtype=torch.float32, device=k.device)
    dg = torch.empty_like(dbeta)
    q_rstd, k_rstd = (None, None) if rstd is None else rstd
    with device_guard(k):
        launch(_wy_bwd_kernel, (plan.num_chunks, H))(
            q,
            k,
            v,
            beta,
            gc,
            Ai,
            dw,
            du,
            parts,
            dq,
            dk,
            dbeta,
            dg,
            dG,
            q_rstd,
            k_rstd,
            plan.cu_seqlens,
            plan.chunk_indices,
            T,
            **stage_constants(plan, tiles, fp32_dot, H=H, HV=HV, K=K, V=V),
            BK=tiles.wy_bwd_bk,
            BV=tiles.BV,
            BKO=tiles.wy_bwd_out_bk,
            NK=dG.shape[-1],
            PB=parts.shape[-1],
            L2NORM=in_kernel,
            num_warps=narrow_slice_warps(tiles.wy_bwd_warps, tiles.wy_bwd_bk, tiles.wy_bwd_out_bk, tiles.BV),
        )
    if rstd is not None and not in_kernel:
        dq, dk = l2norm_bwd(q, q_rstd, dq), l2norm_bwd(k, k_rstd, dk)
    return dq, dk, du, dbeta, dg
