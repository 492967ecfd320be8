"""The sequential passes over chunks, parallel over (segment x value head, V slice); each program keeps
its [K, BV] slice of the state (or of its gradient) in fp32 registers.

Forward, chunk c entering with state S (stored as h[c]):
    v_new = u - w S,   S <- exp(G_last) S + (k exp(G_last - G))^T v_new;
where the pass writes the output itself (`writes_output`: wide slices), it forms v_new = T (beta (v -
exp(G) k S)) from T = (I + A)^-1 (w and u never formed) and stores the chunk's o = scale (q exp(G) S +
P v_new) instead of h[c] and v_new (output._output_kernel's products).
Backward, dS the gradient w.r.t. the state leaving chunk c (stored as dh[c]):
    dv = dv_local + exp(G_last - G) (k dS),
    dS <- exp(G_last) dS + scale (q exp(G))^T do - w^T dv,
which after the first chunk is the initial state's gradient.

Both steps are affine in the state: S <- M_c S + b_c with M_c = exp(G_last) I - (k exp(G_last - G))^T w
(K x K), and dS <- M_c^T dS + b'_c. A sequence is one segment, or, where splitting is on
(`config.segment_length`) and one program per sequence, head and V slice leaves the device idle,
several (`Segments`): then each segment's summary is computed in
parallel (the state it leaves when entered with zero, and the K x K product of its M_c, by running the
same step on identity columns with no input), a combine walks the few segments in order to get the
state entering each, and the plain pass runs over the segments in parallel from those states. The
backward does the same from the right; a segment's backward map is its forward map transposed, so it
reads them from the forward's summaries (the backward recomputes the forward pass anyway).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import cdiv, device_guard
from gdn.backends.triton.chunk_index import ChunkPlan
from gdn.backends.triton.common.config import CHUNK, Tiles, narrow_slice_warps, split_slice, state_slice
from gdn.backends.triton.common.tiles import cast_as, locate_segment, masked_exp, mma, within
from gdn.backends.triton.launch import launch


@triton.jit
def _gates(gc, n, HV: tl.constexpr, BT: tl.constexpr):
    """A chunk of n rows (gc at its first): its rows, their mask, the cumulative gate on them and at
    its last row."""
    o_t = tl.arange(0, BT)
    mt = o_t < n
    G = tl.load(gc + o_t * HV, mask=mt, other=0.0)
    G_last = tl.load(gc + (tl.minimum(BT, n) - 1) * HV)
    return o_t, mt, G, G_last


@triton.jit
def _start_state(
    start,
    bad_offsets,
    i_sh,
    kv,
    m_kv,
    HAS_START,
    IS_VARLEN,
    K: tl.constexpr,
    V: tl.constexpr,
    KP: tl.constexpr,
    BV: tl.constexpr,
):
    """A pass program's slice kv of the state (or gradient) its segment starts from, in fp32: start's
    row i_sh, or zero without one; NaN where the plan refused a packed call's offsets (chunk_index):
    every output, final state and gradient of the call then comes out NaN."""
    S = tl.zeros([KP, BV], dtype=tl.float32)
    if HAS_START != 0:
        S += tl.load(start + i_sh.to(tl.int64) * K * V + kv, mask=m_kv, other=0.0).to(tl.float32)
    if IS_VARLEN != 0:
        bad = tl.zeros([KP], dtype=tl.int32) + tl.load(bad_offsets)
        S = tl.where(bad[:, None] != 0, float("nan"), S)
    return S


@triton.jit
def _fwd_update(
    S,
    k,
    w,
    u,
    rows,
    mt,
    G,
    G_last,
    o_v,
    m_u,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    KP: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """A chunk, the pointers at its first row, its gates (_gates) -> (v_new = u - w S on it, the state
    leaving it); u's columns o_v read where m_u."""
    o_k = tl.arange(0, KP)
    mk = within(o_k, K, KP)
    wt = tl.load(w + rows[:, None] * HV * K + o_k[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
    u_t = tl.load(u + rows[:, None] * HV * V + o_v[None, :], mask=mt[:, None] & m_u[None, :], other=0.0)
    v_new = u_t.to(tl.float32) - mma(wt, cast_as(S, k), FP32_DOT)
    v_dec = v_new * masked_exp(G_last - G, mt)[:, None]
    kT = tl.load(k + rows[None, :] * H * K + o_k[:, None], mask=mt[None, :] & mk[:, None], other=0.0)
    return v_new, S * tl.exp(G_last) + mma(kT, cast_as(v_dec, k), FP32_DOT)


@triton.jit
def _fwd_update_from_inverse(
    S,
    k,
    v,
    beta,
    Ai,
    rows,
    mt,
    G,
    G_last,
    o_v,
    m_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """_fwd_update without w and u: with T = (I + A)^-1, u - w S = T (beta (v - exp(G) k S)), formed
    here from T's rows (Ai), v and beta, so that neither w nor u has to be written and read back (the
    forward's WU kernel is not launched). The same products up to bf16 roundings: T's product with
    one rounded tile instead of w and u each rounded. -> (v_new, the state leaving the chunk, k^T)."""
    o_k = tl.arange(0, KP)
    kt = tl.load(k + rows[:, None] * H * K + o_k[None, :], mask=mt[:, None] & within(o_k, K, KP)[None, :], other=0.0)
    A = tl.load(Ai + rows[:, None] * HV * BT + rows[None, :], mask=mt[:, None], other=0.0)
    b = tl.load(beta + rows * HV, mask=mt, other=0.0).to(tl.float32)
    vt = tl.load(v + rows[:, None] * HV * V + o_v[None, :], mask=mt[:, None] & m_v[None, :], other=0.0)
    x = b[:, None] * (vt.to(tl.float32) - masked_exp(G, mt)[:, None] * mma(kt, cast_as(S, k), FP32_DOT))
    v_new = mma(A, cast_as(x, k), FP32_DOT)
    v_dec = v_new * masked_exp(G_last - G, mt)[:, None]
    kT = tl.trans(kt)
    return v_new, S * tl.exp(G_last) + mma(kT, cast_as(v_dec, k), FP32_DOT), kT


@triton.jit
def _chunk_output(
    S,
    v_new,
    kT,
    q,
    o,
    scale,
    rows,
    mt,
    G,
    o_v,
    mv,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    KP: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """Stores the chunk's output o = scale (q exp(G) S + P v_new), P = tril(q k^T exp(G_i - G_j)), for
    the columns o_v, from the state S entering it (rounded as h would be stored) and v_new (rounded as
    it would be stored): output._output_kernel's products on the stored tensors."""
    o_k = tl.arange(0, KP)
    qt = tl.load(q + rows[:, None] * H * K + o_k[None, :], mask=mt[:, None] & within(o_k, K, KP)[None, :], other=0.0)
    acc = mma(qt, cast_as(S, q), FP32_DOT) * masked_exp(G, mt)[:, None]
    s = mma(qt, kT, FP32_DOT) * masked_exp(G[:, None] - G[None, :], (rows[:, None] >= rows[None, :]) & mt[:, None])
    acc += mma(cast_as(s, q), cast_as(v_new, q), FP32_DOT)
    tl.store(o + rows[:, None] * HV * V + o_v[None, :], cast_as(acc * scale, o), mask=mt[:, None] & mv[None, :])


@triton.jit
def _fwd_step(
    S,
    q,
    k,
    w,
    u,
    v,
    beta,
    Ai,
    gc,
    h,
    o,
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
    OUTPUT: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """One chunk of n rows, the pointers at its first row (h at its state) and the head -> the state
    leaving it and the pointers moved to the next chunk (64-bit pointers: a long segment never
    overflows a 32-bit offset). With OUTPUT it forms v_new from T = (I + A)^-1, v and beta and writes
    the chunk's output rows, and neither its state nor v_new; else it forms v_new from w and u and
    writes both."""
    o_k = tl.arange(0, KP)
    mv = within(o_v, V, BV)
    if OUTPUT:
        # the state's update first, the output's products after it: the other order (the output's
        # products on the entering state first) took 35% longer at 64-column slices on the H200
        rows, mt, G, G_last = _gates(gc, n, HV, BT)
        v_new, S_next, kT = _fwd_update_from_inverse(
            S, k, v, beta, Ai, rows, mt, G, G_last, o_v, mv, H, HV, K, V, BT, KP, FP32_DOT
        )
        _chunk_output(S, v_new, kT, q, o, scale, rows, mt, G, o_v, mv, H, HV, K, V, KP, FP32_DOT)
        S = S_next
    else:
        # Which first, the chunk's gates or the state's store, decides where the pipelined loop waits for
        # the chunk's loads. Measured on the H200 (bf16, K = V = 128): with 32-column slices the store
        # first took 12% longer (one sequence of 8,192 or 32,768 tokens); with 64 the gates first took
        # 1-3% longer.
        if BV <= 32:
            rows, mt, G, G_last = _gates(gc, n, HV, BT)
        tl.store(h + o_k[:, None] * V + o_v[None, :], cast_as(S, h), mask=within(o_k, K, KP)[:, None] & mv[None, :])
        if BV > 32:
            rows, mt, G, G_last = _gates(gc, n, HV, BT)
        v_new, S = _fwd_update(S, k, w, u, rows, mt, G, G_last, o_v, mv, H, HV, K, V, KP, FP32_DOT)
        p_u = u + rows[:, None] * HV * V + o_v[None, :]
        tl.store(p_u, cast_as(v_new, u), mask=mt[:, None] & mv[None, :])
    return (
        S,
        q + BT * H * K,
        k + BT * H * K,
        w + BT * HV * K,
        u + BT * HV * V,
        v + BT * HV * V,
        beta + BT * HV,
        Ai + BT * HV * BT,
        gc + BT * HV,
        h + HV * K * V,
        o + BT * HV * V,
    )


@triton.jit
def _fwd_inputs_at(row, i_h, i_hv, k, w, u, gc, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """The forward's inputs at token `row` (64 bits): k at head i_h, the others at value head i_hv."""
    return k + (row * H + i_h) * K, w + (row * HV + i_hv) * K, u + (row * HV + i_hv) * V, gc + row * HV + i_hv


@triton.jit
def _segment_head(
    i_sh, T, NSEG, SEG, bounds, chunk_offsets, H: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr, IS_VARLEN
):
    """A state pass's program row i_sh (segments in order, value heads within each) -> (its value head,
    that head's query/key head, the segment's first token in 64 bits, its length, its first chunk's row)."""
    i_hv = i_sh % HV
    bos, T_s, boc = locate_segment(i_sh // HV, T, NSEG, SEG, bounds, chunk_offsets, BT, IS_VARLEN)
    return i_hv, i_hv // (HV // H), bos.to(tl.int64), T_s, boc


@triton.jit(do_not_specialize=["T", "NSEG", "SEG", "IS_VARLEN", "HAS_START", "STORE_END"])
def _state_fwd_kernel(
    k,
    w,
    u,
    gc,
    h,
    start,
    end,
    bad_offsets,
    bounds,
    chunk_offsets,
    NSEG,
    SEG,
    T,
    q,
    o,
    scale,
    v,
    beta,
    Ai,
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
    OUTPUT: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """From the state entering each segment (start, or zero): with OUTPUT the output o (q, scale, v,
    beta and T = (I + A)^-1 read instead of w and u), else h[c] (the state entering chunk c) and v_new
    over u (same rows, same program); end: the state leaving each segment."""
    i_sh, i_v = tl.program_id(0), tl.program_id(1)
    i_hv, i_h, bos, T_s, boc = _segment_head(i_sh, T, NSEG, SEG, bounds, chunk_offsets, H, HV, BT, IS_VARLEN)
    o_k = tl.arange(0, KP)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    kv = o_k[:, None] * V + o_v[None, :]
    k, w, u, gc = _fwd_inputs_at(bos, i_h, i_hv, k, w, u, gc, H, HV, K, V)
    q += (bos * H + i_h) * K
    o += (bos * HV + i_hv) * V
    v += (bos * HV + i_hv) * V
    beta += bos * HV + i_hv
    Ai += (bos * HV + i_hv) * BT
    h += (boc * HV + i_hv).to(tl.int64) * K * V

    S = _start_state(start, bad_offsets, i_sh, kv, m_kv, HAS_START, IS_VARLEN, K, V, KP, BV)
    NT = tl.cdiv(T_s, BT)
    for i_t in range(0, NT):
        S, q, k, w, u, v, beta, Ai, gc, h, o = _fwd_step(
            S, q, k, w, u, v, beta, Ai, gc, h, o, scale, T_s - i_t * BT, o_v,
            H, HV, K, V, BT, KP, BV, OUTPUT, FP32_DOT,
        )  # fmt: skip
    if STORE_END != 0:
        tl.store(end + i_sh.to(tl.int64) * K * V + kv, S, mask=m_kv)


@triton.jit
def _summary_columns(i_c, V: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr):
    """A summary program's columns: slices of V (the state left from zero, reading the input) while
    i_c < cdiv(V, BV), then slices of K (the map of the entering state, started from the identity).
    -> (columns within their part, their mask, the mask of the input they read, the identity start,
    the columns in the summary's [K, V + K] rows). Every flag is a block: Triton 3.9's interpreter
    rejects a mask combined from a scalar comparison."""
    NV: tl.constexpr = (V + BV - 1) // BV
    column = i_c * BV + tl.arange(0, BV)
    reads = column < NV * BV
    o_c = tl.where(reads, column, column - NV * BV)
    m_c = o_c < tl.where(reads, V, K)
    o_k = tl.arange(0, KP)
    start = ((o_k[:, None] == o_c[None, :]) & (m_c & (column >= NV * BV))[None, :]).to(tl.float32)
    return o_c, m_c, m_c & reads, start, tl.where(reads, o_c, V + o_c)


@triton.jit(do_not_specialize=["T", "NSEG", "SEG", "IS_VARLEN"])
def _state_fwd_summary_kernel(
    k,
    w,
    u,
    gc,
    summary,
    bounds,
    chunk_offsets,
    NSEG,
    SEG,
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    KP: tl.constexpr,
    BV: tl.constexpr,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    """summary[segment, head] = [B | P] ([K, V + K] fp32): the state leaving the segment is P S + B for
    the state S entering it."""
    i_sh, i_c = tl.program_id(0), tl.program_id(1)
    i_hv, i_h, bos, T_s, _ = _segment_head(i_sh, T, NSEG, SEG, bounds, chunk_offsets, H, HV, BT, IS_VARLEN)
    o_c, m_c, m_u, S, o_out = _summary_columns(i_c, V, K, KP, BV)
    k, w, u, gc = _fwd_inputs_at(bos, i_h, i_hv, k, w, u, gc, H, HV, K, V)

    NT = tl.cdiv(T_s, BT)
    for i_t in range(0, NT):
        rows, mt, G, G_last = _gates(gc, T_s - i_t * BT, HV, BT)
        _v_new, S = _fwd_update(S, k, w, u, rows, mt, G, G_last, o_c, m_u, H, HV, K, V, KP, FP32_DOT)
        k, w, u, gc = k + BT * H * K, w + BT * HV * K, u + BT * HV * V, gc + BT * HV
    o_k = tl.arange(0, KP)
    p = summary + i_sh.to(tl.int64) * K * (V + K) + o_k[:, None] * (V + K) + o_out[None, :]
    tl.store(p, S, mask=(o_k < K)[:, None] & m_c[None, :])


@triton.jit
def _combine_step(
    S,
    summary,
    maps,
    P_ROWS: tl.constexpr,
    P_COLS: tl.constexpr,
    seeds,
    s0,
    s1,
    i,
    REVERSE,
    i_hv,
    o_v,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    KP: tl.constexpr,
    DOT: tl.constexpr,
):
    """The walk's i-th segment: its seed is S, and P S + B what it passes on, B from its summary, P from
    `maps` (the same summaries, or the forward's read transposed: P_ROWS and P_COLS are its strides).
    Neither load depends on S, so the pipelined walk fetches the next segments' maps while this one
    multiplies."""
    i_s = s0 + i + REVERSE * (s1 - 1 - 2 * i - s0)
    o_k = tl.arange(0, KP)
    mk = o_k < K
    mv = o_v < V
    at = (i_s * HV + i_hv).to(tl.int64) * K
    tl.store(seeds + at * V + o_k[:, None] * V + o_v[None, :], S, mask=mk[:, None] & mv[None, :])
    acc = tl.load(
        summary + at * (V + K) + o_k[:, None] * (V + K) + o_v[None, :], mask=mk[:, None] & mv[None, :], other=0.0
    )
    P = tl.load(
        maps + at * (V + K) + V + o_k[:, None] * P_ROWS + o_k[None, :] * P_COLS,
        mask=mk[:, None] & mk[None, :],
        other=0.0,
    )
    return acc + tl.dot(P, S, input_precision=DOT)


@triton.jit
def _sequence_segments(i_n, first, NSEG, IS_VARLEN):
    """Sequence i_n -> its first segment and the one after its last."""
    if IS_VARLEN != 0:
        return tl.load(first + i_n).to(tl.int32), tl.load(first + i_n + 1).to(tl.int32)
    return i_n * NSEG, i_n * NSEG + NSEG


# The map's strides are constants (the forward reads its own summaries by rows, the backward the same
# maps transposed: two binaries): as runtime values they made every map element a 4-byte copy.
@triton.jit(do_not_specialize=["NSEG", "IS_VARLEN", "HAS_START", "STORE_END", "REVERSE"])
def _state_combine_kernel(
    summary,
    maps,
    P_ROWS: tl.constexpr,
    P_COLS: tl.constexpr,
    start,
    seeds,
    end,
    first,
    NSEG,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    KP: tl.constexpr,
    BV: tl.constexpr,
    HAS_START,
    STORE_END,
    REVERSE,
    IS_VARLEN,
    DOT: tl.constexpr,
):
    """Walks a sequence's segments, in order (the forward) or from the last (REVERSE: the backward),
    from start (or zero): seeds[segment] what that segment's pass starts from, end what the walk
    leaves (the final state; the initial state's gradient)."""
    i_nh, i_v = tl.program_id(0), tl.program_id(1)
    i_n, i_hv = i_nh // HV, i_nh % HV
    s0, s1 = _sequence_segments(i_n, first, NSEG, IS_VARLEN)
    o_k = tl.arange(0, KP)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    kv = o_k[:, None] * V + o_v[None, :]
    S = tl.zeros([KP, BV], dtype=tl.float32)
    if HAS_START != 0:
        S += tl.load(start + i_nh.to(tl.int64) * K * V + kv, mask=m_kv, other=0.0).to(tl.float32)
    for i in range(0, s1 - s0):
        S = _combine_step(S, summary, maps, P_ROWS, P_COLS, seeds, s0, s1, i, REVERSE, i_hv, o_v, HV, K, V, KP, DOT)
    if STORE_END != 0:
        tl.store(end + i_nh.to(tl.int64) * K * V + kv, S, mask=m_kv)


@triton.jit
def _bwd_inputs_at(
    row, i_h, i_hv, q, k, w, gc, do, dv, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr
):
    """The backward's inputs at token `row` (64 bits): q and k at head i_h, the others at value head i_hv."""
    return (
        q + (row * H + i_h) * K,
        k + (row * H + i_h) * K,
        w + (row * HV + i_hv) * K,
        gc + row * HV + i_hv,
        do + (row * HV + i_hv) * V,
        dv + (row * HV + i_hv) * V,
    )


@triton.jit
def _bwd_update(
    dS,
    q,
    k,
    w,
    do,
    dv,
    scale,
    rows,
    mt,
    G,
    G_last,
    o_v,
    m_in,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    KP: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """A chunk, the pointers at its first row, its gates (_gates) -> (dv on it, the gradient w.r.t. the
    state entering it); do and the local dv (columns o_v) read where m_in."""
    o_k = tl.arange(0, KP)
    mk = within(o_k, K, KP)
    m_tv = mt[:, None] & m_in[None, :]
    m_kt = mk[:, None] & mt[None, :]
    kt = tl.load(k + rows[:, None] * H * K + o_k[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
    dv_t = mma(kt, cast_as(dS, k), FP32_DOT) * masked_exp(G_last - G, mt)[:, None]
    dv_t += tl.load(dv + rows[:, None] * HV * V + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32)
    qT = tl.load(q + rows[None, :] * H * K + o_k[:, None], mask=m_kt, other=0.0)
    wT = tl.load(w + rows[None, :] * HV * K + o_k[:, None], mask=m_kt, other=0.0)
    do_t = tl.load(do + rows[:, None] * HV * V + o_v[None, :], mask=m_tv, other=0.0)
    # each row's factor scale exp(G) on do's [BT, BV] rows rather than on q's [K, BT] columns: a quarter
    # of the elements at BV = 32, and q goes to the product as loaded
    do_t = cast_as(do_t.to(tl.float32) * (scale * masked_exp(G, mt))[:, None], k)
    return dv_t, dS * tl.exp(G_last) + mma(qT, do_t, FP32_DOT) - mma(wT, cast_as(dv_t, k), FP32_DOT)


@triton.jit
def _bwd_step(
    dS,
    q,
    k,
    w,
    gc,
    do,
    dv,
    dh,
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
    FP32_DOT: tl.constexpr,
):
    """One chunk, in reverse order, pointers as in _fwd_step -> the gradient w.r.t. the state entering
    it and the pointers moved to the chunk before."""
    o_k = tl.arange(0, KP)
    mv = within(o_v, V, BV)
    rows, mt, G, G_last = _gates(gc, n, HV, BT)  # before the store: 1-3% faster at every slice (H200)
    tl.store(dh + o_k[:, None] * V + o_v[None, :], cast_as(dS, dh), mask=within(o_k, K, KP)[:, None] & mv[None, :])
    dv_t, dS = _bwd_update(dS, q, k, w, do, dv, scale, rows, mt, G, G_last, o_v, mv, H, HV, K, V, KP, FP32_DOT)
    tl.store(dv + rows[:, None] * HV * V + o_v[None, :], cast_as(dv_t, dv), mask=mt[:, None] & mv[None, :])
    back = -BT
    return (
        dS,
        q + back * H * K,
        k + back * H * K,
        w + back * HV * K,
        gc + back * HV,
        do + back * HV * V,
        dv + back * HV * V,
        dh - HV * K * V,
    )


@triton.jit(do_not_specialize=["T", "NSEG", "SEG", "IS_VARLEN", "HAS_START", "STORE_END"])
def _state_bwd_kernel(
    q,
    k,
    w,
    gc,
    do,
    dv,
    dh,
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
    HAS_START,
    STORE_END,
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    """Writes dh[c] (gradient w.r.t. the state leaving chunk c) and the full dv over the local dv, from
    the gradient w.r.t. the state leaving each segment (start, or zero); end: the gradient w.r.t. the
    state entering each segment."""
    i_sh, i_v = tl.program_id(0), tl.program_id(1)
    i_hv, i_h, bos, T_s, boc = _segment_head(i_sh, T, NSEG, SEG, bounds, chunk_offsets, H, HV, BT, IS_VARLEN)
    o_k = tl.arange(0, KP)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    kv = o_k[:, None] * V + o_v[None, :]
    dh += (boc * HV + i_hv).to(tl.int64) * K * V

    dS = _start_state(start, bad_offsets, i_sh, kv, m_kv, HAS_START, IS_VARLEN, K, V, KP, BV)
    NT = tl.cdiv(T_s, BT)
    # at the segment's last chunk: the pass walks backwards
    q, k, w, gc, do, dv = _bwd_inputs_at(bos + (NT - 1) * BT, i_h, i_hv, q, k, w, gc, do, dv, H, HV, K, V)
    dh += (NT - 1).to(tl.int64) * HV * K * V
    for i_t in range(NT - 1, -1, -1):
        dS, q, k, w, gc, do, dv, dh = _bwd_step(
            dS, q, k, w, gc, do, dv, dh, scale, T_s - i_t * BT, o_v, H, HV, K, V, BT, KP, BV, FP32_DOT
        )
    if STORE_END != 0:
        tl.store(end + i_sh.to(tl.int64) * K * V + kv, dS, mask=m_kv)


@triton.jit(do_not_specialize=["T", "NSEG", "SEG", "IS_VARLEN"])
def _state_bwd_summary_kernel(
    q,
    k,
    w,
    gc,
    do,
    dv,
    summary,
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
    IS_VARLEN,
    FP32_DOT: tl.constexpr,
):
    """summary[segment, head] = [B | P]: the gradient w.r.t. the state entering the segment is P dS + B
    for the gradient dS w.r.t. the state leaving it."""
    i_sh, i_c = tl.program_id(0), tl.program_id(1)
    i_hv, i_h, bos, T_s, _ = _segment_head(i_sh, T, NSEG, SEG, bounds, chunk_offsets, H, HV, BT, IS_VARLEN)
    o_c, m_c, m_in, dS, o_out = _summary_columns(i_c, V, K, KP, BV)

    NT = tl.cdiv(T_s, BT)
    # at the segment's last chunk: the pass walks backwards
    q, k, w, gc, do, dv = _bwd_inputs_at(bos + (NT - 1) * BT, i_h, i_hv, q, k, w, gc, do, dv, H, HV, K, V)
    back = -BT
    for i_t in range(NT - 1, -1, -1):
        rows, mt, G, G_last = _gates(gc, T_s - i_t * BT, HV, BT)
        _dv, dS = _bwd_update(dS, q, k, w, do, dv, scale, rows, mt, G, G_last, o_c, m_in, H, HV, K, V, KP, FP32_DOT)
        q, k, w, gc = q + back * H * K, k + back * H * K, w + back * HV * K, gc + back * HV
        do, dv = do + back * HV * V, dv + back * HV * V
    o_k = tl.arange(0, KP)
    p = summary + i_sh.to(tl.int64) * K * (V + K) + o_k[:, None] * (V + K) + o_out[None, :]
    tl.store(p, dS, mask=(o_k < K)[:, None] & m_c[None, :])


def _absent(like: torch.Tensor) -> torch.Tensor:
    """Stands for an optional tensor the kernel's runtime flag says it does not read (a None would be a
    constant of its own binary)."""
    return torch.empty(0, dtype=torch.float32, device=like.device)


def pass_slice(tiles: Tiles, plan: ChunkPlan, HV: int, V: int, device) -> int:
    """The V slice of a state pass's programs over the plan (config.state_slice or, split,
    config.split_slice)."""
    if plan.split is None:
        return state_slice(tiles, plan.num_sequences * HV, HV, V, device)
    return split_slice(tiles, HV, V, device)


def writes_output(tiles: Tiles, plan: ChunkPlan, HV: int, V: int, device) -> bool:
    """Whether the forward's state pass over the plan writes the output itself (state_forward_output)
    rather than leaving h and v_new to output.chunk_output: where its slices are at least
    tiles.output_in_state_bv wide (a function of the shapes and the batch, never of the length)."""
    return 0 < tiles.output_in_state_bv <= pass_slice(tiles, plan, HV, V, device)


def _state_pass(
    kernel,
    summary_kernel,
    reads: tuple,
    writes: torch.Tensor,
    scalars: tuple,
    start: torch.Tensor | None,
    end: torch.Tensor | None,
    reverse: bool,
    like: torch.Tensor,
    dims: tuple[int, int, int],
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
    exact_dot: str,
    maps: torch.Tensor | None = None,
    extra: tuple = (),
    flags: dict | None = None,
) -> torch.Tensor | None:
    """One state pass (forward, or backward with `reverse`) over the plan's segments of heads and dims
    (HV, K, V): `kernel(*reads, writes, start, end, <the plan's refused-offsets flag>, <segments>,
    *scalars, *extra, **flags)`, from start (or zero) into end (if given). Split sequences first get
    their segments' summaries and seeds (`summary_kernel(*reads, summary, <segments>, *scalars)`, then
    the combine) -> the summaries, whose maps the backward reuses: its map of a segment is the
    forward's transposed, so with `maps` (the forward's summaries) its summary kernel computes only
    the V columns."""
    HV, K, V = dims
    N = plan.num_sequences
    segments = plan.segments()
    layout = (segments.bounds, segments.chunk_offsets, segments.per_sequence, segments.tokens)
    shapes = dict(H=like.shape[2], HV=HV, K=K, V=V, BT=CHUNK, KP=tiles.KP, IS_VARLEN=int(plan.is_varlen))
    warps = dict(num_warps=tiles.state_warps, num_stages=tiles.state_bwd_stages if reverse else tiles.state_stages)
    summary = None
    bv = pass_slice(tiles, plan, HV, V, like.device)
    if plan.split is not None:
        summary = torch.empty(segments.count, HV, K, V + K, dtype=torch.float32, device=like.device)
        columns = cdiv(V, bv) + (0 if maps is not None else cdiv(K, bv))
        launch(summary_kernel, (segments.count * HV, columns))(
            *reads, summary, *layout, *scalars, **shapes, BV=bv, FP32_DOT=fp32_dot, **warps
        )
        seeds = torch.empty(segments.count, HV, K, V, dtype=torch.float32, device=like.device)
        launch(_state_combine_kernel, (N * HV, cdiv(V, tiles.combine_bv)))(
            summary,
            summary if maps is None else maps,
            V + K if maps is None else 1,
            1 if maps is None else V + K,
            _absent(like) if start is None else start,
            seeds,
            _absent(like) if end is None else end,
            segments.first,
            segments.per_sequence,
            HV=HV,
            K=K,
            V=V,
            KP=tiles.KP,
            BV=tiles.combine_bv,
            HAS_START=int(start is not None),
            STORE_END=int(end is not None),
            REVERSE=int(reverse),
            IS_VARLEN=int(plan.is_varlen),
            DOT=exact_dot,
            num_warps=narrow_slice_warps(tiles.combine_warps, tiles.combine_bv),
            num_stages=tiles.combine_stages,
        )
        start, end = seeds, None
    launch(kernel, (segments.count * HV, cdiv(V, bv)))(
        *reads,
        writes,
        _absent(like) if start is None else start,
        _absent(like) if end is None else end,
        plan.bad_offsets,
        *layout,
        *scalars,
        *extra,
        **shapes,
        BV=bv,
        HAS_START=int(start is not None),
        STORE_END=int(end is not None),
        FP32_DOT=fp32_dot,
        **(flags or {}),
        **warps,
    )
    return summary


def _forward_pass(
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    gc: torch.Tensor,
    heads_dim: tuple[int, int],
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    h: torch.Tensor,
    output: tuple | None,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
    exact_dot: str,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The forward state pass into h, or with `output` = (q, o, scale, v, beta, Ai) into o -> (final
    state fp32 or None, the split segments' summaries or None); heads_dim: (HV, V)."""
    HV, V = heads_dim
    K = k.shape[3]
    ht = torch.empty(plan.num_sequences, HV, K, V, dtype=torch.float32, device=k.device) if output_final_state else None
    with device_guard(k):
        maps = _state_pass(
            _state_fwd_kernel,
            _state_fwd_summary_kernel,
            (k, w, u, gc),
            h,
            (k.shape[1],),
            initial_state,
            ht,
            False,
            k,
            (HV, K, V),
            plan,
            tiles,
            fp32_dot,
            exact_dot,
            extra=output or (_absent(k), _absent(k), 1.0, _absent(k), _absent(k), _absent(k)),
            flags={"OUTPUT": int(output is not None)},
        )
    return ht, maps


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
    exact_dot: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """-> (h [chunks, HV, K, V] entering states in k's dtype, v_new (written over u), final state fp32,
    the split segments' summaries or None: state_backward's `maps`).

    exact_dot: the fp32 precision of the products that combine split sequences' segments."""
    h = torch.empty(plan.num_chunks, u.shape[2], k.shape[3], u.shape[3], dtype=k.dtype, device=k.device)
    ht, maps = _forward_pass(
        k,
        w,
        u,
        gc,
        (u.shape[2], u.shape[3]),
        initial_state,
        output_final_state,
        h,
        None,
        plan,
        tiles,
        fp32_dot,
        exact_dot,
    )
    return h, u, ht, maps


def state_forward_output(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    Ai: torch.Tensor,
    wu: tuple[torch.Tensor, torch.Tensor] | None,
    gc: torch.Tensor,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    scale: float,
    plan: ChunkPlan,
    tiles: Tiles,
    fp32_dot: str | None,
    exact_dot: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward state pass writing the output as it goes (where `writes_output`), forming each chunk's
    v_new from T = (I + A)^-1 (Ai), v and beta: neither h nor v_new is stored, and w and u are read only
    by a split plan's summaries (`wu`, from common.wy.wy_apply; None where the plan does not split)
    -> (o [B, T, HV, V] in v's dtype, final state fp32 or None). Its output is output.chunk_output's
    on state_forward's h and v_new up to bf16 roundings."""
    if (wu is None) != (plan.split is None):
        raise ValueError("state_forward_output: w and u are given exactly where the plan splits sequences")
    # in w's and u's dtype where absent: a whole and a split call of one class share the pass's binary
    w, u = wu or (k.new_empty(0), k.new_empty(0))
    HV, V = v.shape[2], v.shape[3]
    o = torch.empty(v.shape, dtype=v.dtype, device=k.device)
    ht, _ = _forward_pass(
        k,
        w,
        u,
        gc,
        (HV, V),
        initial_state,
        output_final_state,
        _absent(k),
        (q, o, scale, v, beta, Ai),
        plan,
        tiles,
        fp32_dot,
        exact_dot,
    )
    return o, ht


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
    exact_dot: str,
    maps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> (dh [chunks, HV, K, V], dv (written over dv_local), dh0 fp32 or None).

    maps: state_forward's segment summaries over the same plan; where the backward splits too, it reads
    its maps from them (transposed) instead of computing them.

    dh is in k's dtype (as h), and fp32 where the call output its final state (autograd then hands
    the backward that state's gradient, zeros if unused): dh carries it, and its bf16 rounding was the
    largest error in the gate gradient (tokens near the end of a sequence). Without a final state (a
    training step), half-precision dh halves the backward's largest buffer (268 MB in fp32 at one
    sequence of 8,192 tokens and 32 value heads). The kernel class (`output_final_state`) decides
    which, so no call compiles a binary its dry run did not."""
    HV, V = do.shape[2], do.shape[3]
    K = k.shape[3]
    dh = torch.empty(plan.num_chunks, HV, K, V, dtype=k.dtype if dht is None else torch.float32, device=k.device)
    dh0 = torch.empty(plan.num_sequences, HV, K, V, dtype=torch.float32, device=k.device) if want_dh0 else None
    with device_guard(k):
        _state_pass(
            _state_bwd_kernel,
            _state_bwd_summary_kernel,
            (q, k, w, gc, do, dv_local),
            dh,
            (scale, k.shape[1]),
            dht,
            dh0,
            True,
            k,
            (HV, K, V),
            plan if tiles.split_backward else replace(plan, split=None),
            tiles,
            fp32_dot,
            exact_dot,
            maps,
        )
    return dh, dv_local, dh0
