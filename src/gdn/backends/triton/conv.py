"""Depthwise causal conv1d: `causal_conv1d_fn` for prefill (dense [B, D, T], or sequences packed along
T as [D, total_T] against a conv-state pool) and `causal_conv1d_update` for decode (a few new tokens
per row, the pool updated in place).

Tap j of an output at token t reads token t - (W - 1 - j); a tap that falls before its sequence's
first token reads the sequence's history (the W - 1 columns before it: initial_states, a pool row, or
zeros), never another sequence. Arithmetic is fp32; outputs come back in x's dtype.

Both layouts of x are read in place: channel-first (T contiguous) and channel-last (D contiguous,
what a transposed [B, T, D] projection gives), and the output takes the input's layout. Offsets are
computed in the kernels from D and the runtime token count, which Triton does not specialize: no
argument changes with the length, so a new length never compiles a new binary. A packed token finds
its sequence by binary search over query_start_loc on the device (no host sync, graph-capturable).

Prefill writes final states with a second kernel, after the conv kernel has read every history: a
sequence shorter than W - 1 tokens reads and writes the same pool row.

The kernels check the values a serving engine hands them on the device, as the decode kernels do
(decode.py), so that no call reads them on the host: a pool slot out of [-1, slots) or one that
another row of the call also names gives that row's or sequence's outputs NaN and neither reads nor
writes the pool; offsets out of order or past the tokens give every output NaN and write no state;
tokens no sequence covers are NaN. Index -1 keeps its meaning (zero outputs for an update row, no
history and no write for a sequence). Nothing is read or written out of range whatever the values.
Finding a repeated slot costs each program one pass over the call's slot list (a prefill program
compares its tokens' slots with it), and finding offsets out of order one pass over them.

These kernels have no backward: the triton backend serves both ops forward-only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import OpKernel, cdiv, device_guard, next_power_of_2
from gdn.backends.triton.common.tiles import cast_as
from gdn.backends.triton.decode import as_block, offsets_out_of_order, refuse_grad, slot_repeats
from gdn.backends.triton.launch import launch
from gdn.calls import ConvCall, ConvUpdateCall

# Output tile of one prefill program, channels x tokens: 8 outputs a thread. The W shifted tap
# loads of a tile are live together (a shifted tap cannot use vector loads in the channel-first
# layout), which costs about 12 registers an output on sm_90: 16 a thread would be 180.
BLOCK_D = 32
BLOCK_T = 32
FN_WARPS = 4
# Channels of one state / decode program (rows of at most next_pow2(state_len) columns).
STATE_BLOCK_D = 256
STATE_WARPS = 4
# Entries of the call's slot list or offsets one step of the device-side checks reads: a warp's worth, as
# the decode step's scan; a prefill program compares each of its BLOCK_T tokens' slots with them.
CHECK_BLOCK = 32


@triton.jit
def _x_offsets(b, d, p, T, D, CHANNEL_LAST: tl.constexpr):
    """Offsets of x[b, d, p] ([BD] channels x [BP] tokens) in the contiguous channel-first or
    channel-last buffer, in int64."""
    d = d.to(tl.int64)[:, None]
    p = p.to(tl.int64)[None, :]
    if CHANNEL_LAST:
        return (b * T + p) * D + d
    return (b * D + d) * T + p


@triton.jit
def _search_step(lo, hi, t, qsl_ptr):
    """One halving of [lo, hi], which holds the last sequence n with query_start_loc[n] <= t."""
    mid = (lo + hi + 1) // 2
    right = tl.load(qsl_ptr + mid) <= t
    return tl.where(right, mid, lo), tl.where(right, hi, mid - 1)


@triton.jit
def _sequence_of(t, qsl_ptr, N, steps, BT: tl.constexpr):
    """For each token t, the last sequence n with query_start_loc[n] <= t (empty sequences before a
    token share its start, and the last of them is the token's own)."""
    lo = tl.zeros([BT], dtype=tl.int32)
    hi = tl.zeros([BT], dtype=tl.int32) + (N - 1)
    for _ in range(steps):
        lo, hi = _search_step(lo, hi, t, qsl_ptr)
    return lo


@triton.jit
def _slots_refused(slots_ptr, rows, N, SLOTS, BR: tl.constexpr, BLOCK_N: tl.constexpr):
    """For each of BR rows of the call (a token's sequence, repeats allowed), whether its slot cannot
    be served: out of [-1, SLOTS), or live and named by another row too (two rows would write one
    slot). As a count per row, 0 where it is served (the Triton 3.2 interpreter cannot negate an int1)."""
    slot = tl.load(slots_ptr + rows).to(tl.int64)
    count = tl.zeros([BR], dtype=tl.int32)
    for start in range(0, N, BLOCK_N):
        o_m = start + tl.arange(0, BLOCK_N)
        others = tl.load(slots_ptr + o_m, mask=o_m < N, other=-1).to(tl.int64)
        same = (others[None, :] == slot[:, None]) & (o_m[None, :] != rows[:, None])
        count += tl.sum(same.to(tl.int32), 1)
    return (slot < -1).to(tl.int32) + (slot >= SLOTS).to(tl.int32) + ((slot >= 0) & (count > 0)).to(tl.int32)


@triton.jit(do_not_specialize=["T", "N", "steps", "SLOTS"])
def _conv_fn_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    hist_ptr,
    hist_rows_ptr,
    slots_ptr,
    seq_idx_ptr,
    qsl_ptr,
    T,
    D,
    N,
    steps,
    SLOTS,
    stride_hs,
    stride_hd,
    stride_hw,
    W: tl.constexpr,
    BD: tl.constexpr,
    BT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_HIST: tl.constexpr,
    HAS_SEQ_IDX: tl.constexpr,
    VARLEN: tl.constexpr,
    CHECK_SLOTS: tl.constexpr,
    CHANNEL_LAST: tl.constexpr,
):
    """Grid (B * token blocks, channel blocks). Dense: row b, history row b of hist. Varlen (B = 1):
    each token's history row is hist_rows[its sequence] (-1: zeros). Varlen outputs are NaN for a
    token of no sequence, of a sequence whose pool slot (slots, CHECK_SLOTS) is refused, and for every
    token when the offsets are out of order or past T; nothing is read for those."""
    NT = tl.cdiv(T, BT)
    b = (tl.program_id(0) // NT).to(tl.int64)
    t = (tl.program_id(0) % NT) * BT + tl.arange(0, BT)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    t_mask = t < T
    d_mask = d < D
    if VARLEN:
        seq = _sequence_of(t, qsl_ptr, N, steps, BT)
        start = tl.load(qsl_ptr + seq)
        end = tl.load(qsl_ptr + seq + 1)
        # served: inside its sequence, offsets in order (else sequences overlap and a tap could leave x),
        # its slot served; a count of what fails, 0 where served
        unserved = (t < start).to(tl.int32) + (t >= end).to(tl.int32) + offsets_out_of_order(qsl_ptr, N, T, BLOCK_N)
        if CHECK_SLOTS:
            unserved += _slots_refused(slots_ptr, seq, N, SLOTS, BT, BLOCK_N)
        t_mask = t_mask & (unserved == 0)
        if HAS_HIST:
            hrow = tl.load(hist_rows_ptr + seq).to(tl.int64)
    else:
        start = 0
        hrow = as_block(b, BT)
    if HAS_SEQ_IDX:
        sid_t = tl.load(seq_idx_ptr + b * T + t, mask=t_mask)
        # History before the batch start belongs to the row's first sequence.
        sid_0 = tl.load(seq_idx_ptr + b * T)

    acc = tl.zeros([BD, BT], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + d, mask=d_mask, other=0.0).to(tl.float32)[:, None]
    for j in tl.static_range(W):
        p = t - (W - 1 - j)
        in_x = t_mask & (p >= start)
        if HAS_SEQ_IDX:
            in_x = in_x & (tl.load(seq_idx_ptr + b * T + p, mask=in_x) == sid_t)
        tap = tl.load(
            x_ptr + _x_offsets(b, d, p, T, D, CHANNEL_LAST), mask=d_mask[:, None] & in_x[None, :], other=0.0
        ).to(tl.float32)
        if HAS_HIST:
            in_h = t_mask & (p < start) & (hrow >= 0)
            if HAS_SEQ_IDX:
                in_h = in_h & (sid_0 == sid_t)
            col = (hrow * stride_hs + (W - 1 + p - start) * stride_hw)[None, :]
            h_off = d.to(tl.int64)[:, None] * stride_hd + col
            tap += tl.load(hist_ptr + h_off, mask=d_mask[:, None] & in_h[None, :], other=0.0).to(tl.float32)
        acc += tl.load(w_ptr + d * W + j, mask=d_mask, other=0.0).to(tl.float32)[:, None] * tap
    if SILU:
        acc = acc * tl.sigmoid(acc)
    if VARLEN:
        acc = tl.where((unserved == 0)[None, :], acc, float("nan"))
    out_off = _x_offsets(b, d, t, T, D, CHANNEL_LAST)
    tl.store(out_ptr + out_off, cast_as(acc, out_ptr), mask=d_mask[:, None] & (t < T)[None, :])


@triton.jit(do_not_specialize=["T", "N", "SLOTS"])
def _conv_state_kernel(
    x_ptr,
    hist_ptr,
    hist_rows_ptr,
    qsl_ptr,
    dest_ptr,
    dest_rows_ptr,
    T,
    D,
    N,
    SLOTS,
    stride_hs,
    stride_hd,
    stride_hw,
    stride_ds,
    stride_dd,
    stride_dw,
    W: tl.constexpr,
    HP: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_HIST: tl.constexpr,
    VARLEN: tl.constexpr,
    CHECK_SLOTS: tl.constexpr,
    CHANNEL_LAST: tl.constexpr,
):
    """Grid (rows or sequences, channel blocks): the last W - 1 columns of [history, x] of each
    sequence, written to its destination row (dest_rows[n] in the pool; -1 writes nothing, and so do
    a refused slot and offsets out of order: the conv kernel gave those sequences NaN)."""
    n = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    d_mask = d < D
    if VARLEN:
        b = 0
        start = tl.load(qsl_ptr + n)
        end = tl.load(qsl_ptr + n + 1)
        dest = tl.load(dest_rows_ptr + n).to(tl.int64)
        unserved = offsets_out_of_order(qsl_ptr, N, T, BLOCK_N)
        if CHECK_SLOTS:
            repeats = slot_repeats(dest_rows_ptr, n, dest, N, BLOCK_N)
            unserved += (dest >= SLOTS).to(tl.int32) + ((dest >= 0) & (repeats > 0)).to(tl.int32)
        dest = tl.where(unserved == 0, dest, -1)  # below -1 writes nothing either
        if HAS_HIST:
            hrow = tl.load(hist_rows_ptr + n).to(tl.int64)
    else:
        b = n
        start = 0
        end = T
        dest = n
        hrow = n
    i = tl.arange(0, HP)
    pos = end - (W - 1) + i
    live = (i < W - 1) & (as_block(dest, HP) >= 0)
    mask = d_mask[:, None] & live[None, :]
    in_x = pos >= start
    col = tl.load(x_ptr + _x_offsets(b, d, pos, T, D, CHANNEL_LAST), mask=mask & in_x[None, :], other=0.0).to(
        tl.float32
    )
    if HAS_HIST:
        in_h = (pos < start) & (as_block(hrow, HP) >= 0)
        h_off = hrow * stride_hs + d.to(tl.int64)[:, None] * stride_hd + ((W - 1 + pos - start) * stride_hw)[None, :]
        old = tl.load(hist_ptr + h_off, mask=mask & in_h[None, :], other=0.0).to(tl.float32)
        col = tl.where(in_x[None, :], col, old)
    # The history row may be the row written below: every thread reads before any thread writes.
    tl.debug_barrier()
    d_off = dest * stride_ds + d.to(tl.int64)[:, None] * stride_dd + (i * stride_dw)[None, :]
    tl.store(dest_ptr + d_off, cast_as(col, dest_ptr), mask=mask)


def _epilogue(bias: torch.Tensor | None, activation: str | None) -> dict[str, bool]:
    """The output's epilogue flags both convolution kernels take: a bias added, then SiLU applied."""
    return dict(HAS_BIAS=bias is not None, SILU=activation in ("silu", "swish"))


def _channel_last(x: torch.Tensor) -> bool:
    """Whether x [..., D, T] is a dense channel-last buffer (memory order [..., T, D])."""
    return x.shape[-1] > 1 and x.shape[-2] > 1 and x.transpose(-1, -2).is_contiguous()


def _like_input(x: torch.Tensor, channel_last: bool) -> torch.Tensor:
    if channel_last:
        return torch.empty(x.transpose(-1, -2).shape, dtype=x.dtype, device=x.device).transpose(-1, -2)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def causal_conv1d_fn(call: ConvCall):
    """The `causal_conv1d_fn` op of the triton backend (forward only)."""
    x, weight, bias, activation, initial_states = call.x, call.weight, call.bias, call.activation, call.initial_states
    query_start_loc, conv_states, cache_indices = call.query_start_loc, call.conv_states, call.cache_indices
    has_initial_state, seq_idx, return_final_states = call.has_initial_state, call.seq_idx, call.return_final_states
    refuse_grad("causal_conv1d_fn", x=x, weight=weight, bias=bias, initial_states=initial_states)
    channel_last = _channel_last(x)
    if not channel_last:
        x = x.contiguous()
    D, T = x.shape[-2:]
    W = weight.shape[1]
    varlen = query_start_loc is not None
    B = 1 if varlen else x.shape[0]
    N = query_start_loc.numel() - 1 if varlen else B
    hist = hist_rows = dest = dest_rows = None
    if varlen and conv_states is not None and W > 1:
        dest = conv_states
        dest_rows = torch.arange(N, device=x.device) if cache_indices is None else cache_indices
        if has_initial_state is not None:
            hist = conv_states
            # a refused slot reads nothing: the kernels check it before they read hist_rows
            hist_rows = torch.where(has_initial_state & (dest_rows >= 0), dest_rows, -1)
    elif not varlen and initial_states is not None and W > 1:
        hist = initial_states.contiguous()
    hist_strides = hist.stride() if hist is not None else (0, 0, 0)
    # slots the user named are checked on the device; the default ones (0..N-1, in a pool of >= N rows) are not
    check_slots = dest is not None and cache_indices is not None

    out = _like_input(x, channel_last)
    common = dict(
        T=T,
        D=D,
        N=N,
        SLOTS=conv_states.shape[0] if check_slots else 0,
        W=W,
        BLOCK_N=CHECK_BLOCK,
        CHANNEL_LAST=channel_last,
        VARLEN=varlen,
        HAS_HIST=hist is not None,
        CHECK_SLOTS=check_slots,
    )
    with device_guard(x):
        launch(_conv_fn_kernel, (B * cdiv(T, BLOCK_T), cdiv(D, BLOCK_D)))(
            x,
            weight,
            bias,
            out,
            hist,
            hist_rows,
            dest_rows if check_slots else None,
            seq_idx,
            query_start_loc,
            steps=(N - 1).bit_length(),
            stride_hs=hist_strides[0],
            stride_hd=hist_strides[1],
            stride_hw=hist_strides[2],
            BD=BLOCK_D,
            BT=BLOCK_T,
            **_epilogue(bias, activation),
            HAS_SEQ_IDX=seq_idx is not None,
            num_warps=FN_WARPS,
            **common,
        )
        final = None
        if return_final_states:
            final = torch.empty(B, D, W - 1, dtype=x.dtype, device=x.device)
            dest, dest_rows = final, None
        if dest is not None and W > 1:
            launch(_conv_state_kernel, (N, cdiv(D, STATE_BLOCK_D)))(
                x,
                hist,
                hist_rows,
                query_start_loc,
                dest,
                dest_rows,
                stride_hs=hist_strides[0],
                stride_hd=hist_strides[1],
                stride_hw=hist_strides[2],
                stride_ds=dest.stride(0),
                stride_dd=dest.stride(1),
                stride_dw=dest.stride(2),
                HP=next_power_of_2(W - 1),
                BD=STATE_BLOCK_D,
                num_warps=STATE_WARPS,
                **common,
            )
    return (out, final) if return_final_states else out


@triton.jit
def _update_output(
    i,
    x_row,
    state_row,
    w_ptr,
    bias_ptr,
    out_ptr,
    b,
    d,
    L,
    D,
    live,
    fill,
    row_mask,
    stride_w,
    W: tl.constexpr,
    S: tl.constexpr,
    BD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
):
    """Output token i of one row: taps j read E[S - (W - 1) + i + j]; `fill` where the row is not
    served (`live` false)."""
    d_mask = d < D
    acc = tl.zeros([BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + d, mask=d_mask, other=0.0).to(tl.float32)
    for j in tl.static_range(W):
        e = S - (W - 1) + i + j
        tap = tl.load(state_row + e * stride_w, mask=row_mask & (as_block(e, BD) < S), other=0.0).to(tl.float32)
        tap += tl.load(x_row + (e - S), mask=row_mask & (as_block(e, BD) >= S), other=0.0).to(tl.float32)
        acc += tl.load(w_ptr + d * W + j, mask=d_mask, other=0.0).to(tl.float32) * tap
    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(live, acc, fill)
    tl.store(out_ptr + (b * D + d.to(tl.int64)) * L + i, cast_as(acc, out_ptr), mask=d_mask)


@triton.jit(do_not_specialize=["L", "B", "SLOTS"])
def _conv_update_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    state_ptr,
    slots_ptr,
    L,
    D,
    B,
    SLOTS,
    stride_s,
    stride_d,
    stride_w,
    W: tl.constexpr,
    S: tl.constexpr,
    SP: tl.constexpr,
    BD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
):
    """Grid (B, channel blocks). Row b works on E = [state (S columns), x[b] (L columns)]: output l
    is the conv ending at E[S + l], and the new state is E's last S columns. Slots are checked on the
    device: -1 gives zero outputs; a slot out of [-1, SLOTS) or one another row names too gives NaN
    outputs; neither reads or writes the pool."""
    b = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BD + tl.arange(0, BD)
    if HAS_SLOTS:
        slot = tl.load(slots_ptr + b).to(tl.int64)
        repeats = slot_repeats(slots_ptr, b, slot, B, BLOCK_N)
        wrong = (slot < -1).to(tl.int32) + (slot >= SLOTS).to(tl.int32) + ((slot >= 0) & (repeats > 0)).to(tl.int32)
        live = (slot >= 0) & (wrong == 0)
        fill = tl.where(wrong > 0, float("nan"), 0.0)
    else:  # row b is state row b (the validation checked there are B rows)
        slot = b
        live = slot >= 0
        fill = 0.0
    d_mask = d < D
    row_mask = d_mask & (as_block(live.to(tl.int64), BD) > 0)
    state_row = state_ptr + tl.where(live, slot, 0) * stride_s + d.to(tl.int64) * stride_d
    x_row = x_ptr + (b * D + d.to(tl.int64)) * L

    for i in range(L):
        _update_output(
            i, x_row, state_row, w_ptr, bias_ptr, out_ptr, b, d, L, D, live, fill, row_mask, stride_w,
            W, S, BD, HAS_BIAS, SILU,
        )  # fmt: skip

    c = tl.arange(0, SP)
    src = c + L  # column of E that becomes state column c
    mask = row_mask[:, None] & (c < S)[None, :]
    old = tl.load(state_row[:, None] + (src * stride_w)[None, :], mask=mask & (src < S)[None, :], other=0.0)
    new = tl.load(x_row[:, None] + (src - S)[None, :], mask=mask & (src >= S)[None, :], other=0.0)
    new = tl.where((src < S)[None, :], old.to(tl.float32), new.to(tl.float32))
    # Threads read state columns that other threads overwrite: all reads first.
    tl.debug_barrier()
    tl.store(state_row[:, None] + (c * stride_w)[None, :], cast_as(new, state_ptr), mask=mask)


def causal_conv1d_update(call: ConvUpdateCall):
    """The `causal_conv1d_update` op of the triton backend (forward only): rows whose index is -1
    get zero outputs and leave the pool untouched; a slot out of range or repeated gives NaN outputs
    and leaves the pool untouched."""
    x, conv_state, weight, bias, activation = call.x, call.conv_state, call.weight, call.bias, call.activation
    conv_state_indices = call.conv_state_indices
    refuse_grad("causal_conv1d_update", x=x, weight=weight, bias=bias)
    squeeze = x.ndim == 2
    xs = (x.unsqueeze(-1) if squeeze else x).contiguous()
    B, D, L = xs.shape
    W = weight.shape[1]
    S = conv_state.shape[-1]
    out = torch.empty_like(xs)
    with device_guard(xs):
        launch(_conv_update_kernel, (B, cdiv(D, STATE_BLOCK_D)))(
            xs,
            weight,
            bias,
            out,
            conv_state,
            conv_state_indices,
            L,
            D,
            B,
            conv_state.shape[0],
            *conv_state.stride(),
            W=W,
            S=S,
            SP=next_power_of_2(S),
            BD=STATE_BLOCK_D,
            BLOCK_N=CHECK_BLOCK,
            **_epilogue(bias, activation),
            HAS_SLOTS=conv_state_indices is not None,
            num_warps=STATE_WARPS,
        )
    return out.squeeze(-1) if squeeze else out


# The ops this module serves (TritonBackend.loader): serving kernels without a backward, which check the
# pool's slots and the offsets on the device; no matmul, so a few fp32 ulps from eager.
OPS = {
    "causal_conv1d_fn": OpKernel(causal_conv1d_fn, forward_only=True, guards_values=True, probe_tolerance=1e-5),
    "causal_conv1d_update": OpKernel(causal_conv1d_update, forward_only=True, guards_values=True, probe_tolerance=1e-5),
}
