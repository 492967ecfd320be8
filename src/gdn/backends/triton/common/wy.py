"""The WY representation of each chunk (forward; the backward recomputes w and u with `wy_apply`).

`wy_prepare`, one program per (chunk, value head):
  - the chunk-local cumulative gate G (fp32), kept for every later stage;
  - A = beta_i k_i.k_j exp(G_i - G_j) for j < i, built as the ten lower 16 x 16 blocks of the chunk;
  - T = (I + A)^-1: forward substitution inside each diagonal block, then the off-diagonal blocks
    from T_ij = -T_ii sum_{j <= m < i} A_im T_mj (block forward substitution, no power series).
`wy_apply`: w = T (beta exp(G) k) and u = T (beta v).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import device_guard
from gdn.backends.triton.chunk_index import ChunkPlan
from gdn.backends.triton.common.config import CHUNK, SUB_CHUNK, Tiles, stage_constants
from gdn.backends.triton.common.tiles import cast_as, chunk_rows, locate_chunk, masked_exp, mma
from gdn.backends.triton.launch import launch
from gdn.gates import GATE_FLOOR as _GATE_FLOOR

GATE_FLOOR = tl.constexpr(_GATE_FLOOR)  # gdn.gates


@triton.jit
def _lower_step(Y, R, FP32_DOT: tl.constexpr):
    if FP32_DOT is not None:
        return Y + tl.dot(R, Y, input_precision=FP32_DOT)
    return Y + tl.dot(R, Y)


@triton.jit
def _unit_lower_inverses(A0, A1, A2, A3, BC: tl.constexpr, FP32_DOT: tl.constexpr):
    """(I + A)^-1 of four strictly lower [BC, BC] blocks by forward substitution: with Y = T - I,
    y_i = -a_i - sum_{m < i} a_im y_m. Row i of Y still holds -a_i when its turn comes, so with R = Y
    masked to row i, Y + R Y updates row i alone (registers cannot be indexed by row). The four
    substitutions are independent and share one loop: each step's dots can overlap instead of
    waiting on one chain of BC - 1 dependent dots per block."""
    o = tl.arange(0, BC)
    Y0, Y1, Y2, Y3 = -A0, -A1, -A2, -A3
    for i in range(1, BC):
        row = o[:, None] == i
        Y0 = _lower_step(Y0, tl.where(row, Y0, 0.0), FP32_DOT)
        Y1 = _lower_step(Y1, tl.where(row, Y1, 0.0), FP32_DOT)
        Y2 = _lower_step(Y2, tl.where(row, Y2, 0.0), FP32_DOT)
        Y3 = _lower_step(Y3, tl.where(row, Y3, 0.0), FP32_DOT)
    eye = tl.where(o[:, None] == o[None, :], 1.0, 0.0)
    return Y0 + eye, Y1 + eye, Y2 + eye, Y3 + eye


@triton.jit(do_not_specialize=["T", "IS_VARLEN"])
def _prepare_kernel(
    g,
    beta,
    k,
    gc,
    Ai,
    cu_seqlens,
    chunk_indices,
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    i_t, bos, T_n = locate_chunk(i_c, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    if i_t * BT >= T_n:  # a grid row past its sequence's chunks (tiles.locate_chunk)
        return
    o = tl.arange(0, BC)
    r0 = i_t * BT + o
    r1 = r0 + BC
    r2 = r1 + BC
    r3 = r2 + BC
    m0, m1, m2, m3 = r0 < T_n, r1 < T_n, r2 < T_n, r3 < T_n
    t0 = (bos + r0).to(tl.int64)
    t1 = (bos + r1).to(tl.int64)
    t2 = (bos + r2).to(tl.int64)
    t3 = (bos + r3).to(tl.int64)

    # Chunk-local cumulative gate, one sub-chunk at a time with the running total carried over; a gate
    # of -inf (complete decay) is raised to GATE_FLOOR, where every difference of G stays finite
    g0 = tl.maximum(tl.load(g + t0 * HV + i_hv, mask=m0, other=0.0).to(tl.float32), GATE_FLOOR)
    g1 = tl.maximum(tl.load(g + t1 * HV + i_hv, mask=m1, other=0.0).to(tl.float32), GATE_FLOOR)
    g2 = tl.maximum(tl.load(g + t2 * HV + i_hv, mask=m2, other=0.0).to(tl.float32), GATE_FLOOR)
    g3 = tl.maximum(tl.load(g + t3 * HV + i_hv, mask=m3, other=0.0).to(tl.float32), GATE_FLOOR)
    G0 = tl.cumsum(g0, 0)
    G1 = tl.cumsum(g1, 0) + tl.sum(g0, 0)
    G2 = tl.cumsum(g2, 0) + (tl.sum(g0, 0) + tl.sum(g1, 0))
    G3 = tl.cumsum(g3, 0) + (tl.sum(g0, 0) + tl.sum(g1, 0) + tl.sum(g2, 0))
    tl.store(gc + t0 * HV + i_hv, G0, mask=m0)
    tl.store(gc + t1 * HV + i_hv, G1, mask=m1)
    tl.store(gc + t2 * HV + i_hv, G2, mask=m2)
    tl.store(gc + t3 * HV + i_hv, G3, mask=m3)

    # The ten lower blocks of K K^T (padded rows load as zero keys).
    A00 = tl.zeros([BC, BC], dtype=tl.float32)
    A10 = tl.zeros([BC, BC], dtype=tl.float32)
    A11 = tl.zeros([BC, BC], dtype=tl.float32)
    A20 = tl.zeros([BC, BC], dtype=tl.float32)
    A21 = tl.zeros([BC, BC], dtype=tl.float32)
    A22 = tl.zeros([BC, BC], dtype=tl.float32)
    A30 = tl.zeros([BC, BC], dtype=tl.float32)
    A31 = tl.zeros([BC, BC], dtype=tl.float32)
    A32 = tl.zeros([BC, BC], dtype=tl.float32)
    A33 = tl.zeros([BC, BC], dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        mk = o_k < K
        kb0 = tl.load(k + (t0 * H + i_h)[:, None] * K + o_k[None, :], mask=m0[:, None] & mk[None, :], other=0.0)
        kb1 = tl.load(k + (t1 * H + i_h)[:, None] * K + o_k[None, :], mask=m1[:, None] & mk[None, :], other=0.0)
        kb2 = tl.load(k + (t2 * H + i_h)[:, None] * K + o_k[None, :], mask=m2[:, None] & mk[None, :], other=0.0)
        kb3 = tl.load(k + (t3 * H + i_h)[:, None] * K + o_k[None, :], mask=m3[:, None] & mk[None, :], other=0.0)
        A00 += mma(kb0, tl.trans(kb0), FP32_DOT)
        A10 += mma(kb1, tl.trans(kb0), FP32_DOT)
        A11 += mma(kb1, tl.trans(kb1), FP32_DOT)
        A20 += mma(kb2, tl.trans(kb0), FP32_DOT)
        A21 += mma(kb2, tl.trans(kb1), FP32_DOT)
        A22 += mma(kb2, tl.trans(kb2), FP32_DOT)
        A30 += mma(kb3, tl.trans(kb0), FP32_DOT)
        A31 += mma(kb3, tl.trans(kb1), FP32_DOT)
        A32 += mma(kb3, tl.trans(kb2), FP32_DOT)
        A33 += mma(kb3, tl.trans(kb3), FP32_DOT)

    b0 = tl.load(beta + t0 * HV + i_hv, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(beta + t1 * HV + i_hv, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(beta + t2 * HV + i_hv, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(beta + t3 * HV + i_hv, mask=m3, other=0.0).to(tl.float32)
    strict = o[:, None] > o[None, :]
    A00 *= masked_exp(G0[:, None] - G0[None, :], strict & m0[:, None]) * b0[:, None]
    A11 *= masked_exp(G1[:, None] - G1[None, :], strict & m1[:, None]) * b1[:, None]
    A22 *= masked_exp(G2[:, None] - G2[None, :], strict & m2[:, None]) * b2[:, None]
    A33 *= masked_exp(G3[:, None] - G3[None, :], strict & m3[:, None]) * b3[:, None]
    A10 *= masked_exp(G1[:, None] - G0[None, :], m1[:, None] & m0[None, :]) * b1[:, None]
    A20 *= masked_exp(G2[:, None] - G0[None, :], m2[:, None] & m0[None, :]) * b2[:, None]
    A21 *= masked_exp(G2[:, None] - G1[None, :], m2[:, None] & m1[None, :]) * b2[:, None]
    A30 *= masked_exp(G3[:, None] - G0[None, :], m3[:, None] & m0[None, :]) * b3[:, None]
    A31 *= masked_exp(G3[:, None] - G1[None, :], m3[:, None] & m1[None, :]) * b3[:, None]
    A32 *= masked_exp(G3[:, None] - G2[None, :], m3[:, None] & m2[None, :]) * b3[:, None]

    T00, T11, T22, T33 = _unit_lower_inverses(A00, A11, A22, A33, BC, FP32_DOT)
    T10 = -mma(mma(T11, A10, FP32_DOT), T00, FP32_DOT)
    T21 = -mma(mma(T22, A21, FP32_DOT), T11, FP32_DOT)
    T32 = -mma(mma(T33, A32, FP32_DOT), T22, FP32_DOT)
    T20 = -mma(T22, mma(A20, T00, FP32_DOT) + mma(A21, T10, FP32_DOT), FP32_DOT)
    T31 = -mma(T33, mma(A31, T11, FP32_DOT) + mma(A32, T21, FP32_DOT), FP32_DOT)
    T30 = -mma(T33, mma(A30, T00, FP32_DOT) + mma(A31, T10, FP32_DOT) + mma(A32, T20, FP32_DOT), FP32_DOT)

    # T is lower triangular: the blocks above the diagonal are stored as zeros.
    zero = tl.zeros([BC, BC], dtype=Ai.dtype.element_ty)
    p0 = Ai + (t0 * HV + i_hv)[:, None] * BT + o[None, :]
    p1 = Ai + (t1 * HV + i_hv)[:, None] * BT + o[None, :]
    p2 = Ai + (t2 * HV + i_hv)[:, None] * BT + o[None, :]
    p3 = Ai + (t3 * HV + i_hv)[:, None] * BT + o[None, :]
    tl.store(p0, cast_as(T00, Ai), mask=m0[:, None])
    tl.store(p0 + BC, zero, mask=m0[:, None])
    tl.store(p0 + 2 * BC, zero, mask=m0[:, None])
    tl.store(p0 + 3 * BC, zero, mask=m0[:, None])
    tl.store(p1, cast_as(T10, Ai), mask=m1[:, None])
    tl.store(p1 + BC, cast_as(T11, Ai), mask=m1[:, None])
    tl.store(p1 + 2 * BC, zero, mask=m1[:, None])
    tl.store(p1 + 3 * BC, zero, mask=m1[:, None])
    tl.store(p2, cast_as(T20, Ai), mask=m2[:, None])
    tl.store(p2 + BC, cast_as(T21, Ai), mask=m2[:, None])
    tl.store(p2 + 2 * BC, cast_as(T22, Ai), mask=m2[:, None])
    tl.store(p2 + 3 * BC, zero, mask=m2[:, None])
    tl.store(p3, cast_as(T30, Ai), mask=m3[:, None])
    tl.store(p3 + BC, cast_as(T31, Ai), mask=m3[:, None])
    tl.store(p3 + 2 * BC, cast_as(T32, Ai), mask=m3[:, None])
    tl.store(p3 + 3 * BC, cast_as(T33, Ai), mask=m3[:, None])


@triton.jit(do_not_specialize=["T", "IS_VARLEN"])
def _wu_kernel(
    k,
    v,
    beta,
    gc,
    Ai,
    w,
    u,
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
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    i_t, bos, T_n = locate_chunk(i_c, T, cu_seqlens, chunk_indices, BT, IS_VARLEN)
    if i_t * BT >= T_n:  # a grid row past its sequence's chunks (tiles.locate_chunk)
        return
    o_t, mt, tok = chunk_rows(i_t, bos, T_n, BT)

    A = tl.load(Ai + (tok * HV + i_hv)[:, None] * BT + o_t[None, :], mask=mt[:, None], other=0.0)
    b = tl.load(beta + tok * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
    G = tl.load(gc + tok * HV + i_hv, mask=mt, other=0.0)
    kscale = b * masked_exp(G, mt)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        mask = mt[:, None] & (o_k < K)[None, :]
        kt = tl.load(k + (tok * H + i_h)[:, None] * K + o_k[None, :], mask=mask, other=0.0).to(tl.float32)
        wt = mma(A, cast_as(kt * kscale[:, None], k), FP32_DOT)
        tl.store(w + (tok * HV + i_hv)[:, None] * K + o_k[None, :], cast_as(wt, w), mask=mask)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        mask = mt[:, None] & (o_v < V)[None, :]
        vt = tl.load(v + (tok * HV + i_hv)[:, None] * V + o_v[None, :], mask=mask, other=0.0).to(tl.float32)
        ut = mma(A, cast_as(vt * b[:, None], k), FP32_DOT)
        tl.store(u + (tok * HV + i_hv)[:, None] * V + o_v[None, :], cast_as(ut, u), mask=mask)


def wy_prepare(
    k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, HV: int, plan: ChunkPlan, tiles: Tiles, fp32_dot: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (G [B, T, HV] fp32 chunk-local cumulative gate, T = (I + A)^-1 [B, T, HV, 64] in k's dtype)."""
    B, T, H, K = k.shape
    gc = torch.empty(B, T, HV, dtype=torch.float32, device=k.device)
    Ai = torch.empty(B, T, HV, CHUNK, dtype=k.dtype, device=k.device)
    with device_guard(k):
        launch(_prepare_kernel, (plan.num_chunks, HV))(
            g,
            beta,
            k,
            gc,
            Ai,
            plan.cu_seqlens,
            plan.chunk_indices,
            T,
            **stage_constants(plan, tiles, fp32_dot, H=H, HV=HV, K=K),
            BC=SUB_CHUNK,
            BK=tiles.BK,
            num_warps=tiles.prepare_warps,
        )
    return gc, Ai


def wy_apply(
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    gc: torch.Tensor,
    Ai: torch.Tensor,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (w [B, T, HV, K], u [B, T, HV, V]) in k's dtype."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    w = torch.empty(B, T, HV, K, dtype=k.dtype, device=k.device)
    u = torch.empty(B, T, HV, V, dtype=k.dtype, device=k.device)
    with device_guard(k):
        launch(_wu_kernel, (plan.num_chunks, HV))(
            k,
            v,
            beta,
            gc,
            Ai,
            w,
            u,
            plan.cu_seqlens,
            plan.chunk_indices,
            T,
            **stage_constants(plan, tiles, fp32_dot, H=H, HV=HV, K=K, V=V),
            BK=tiles.BK,
            BV=tiles.BV,
            num_warps=tiles.wu_warps,
        )
    return w, u
