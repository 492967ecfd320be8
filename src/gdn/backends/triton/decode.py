"""The fused recurrent gated delta rule for decode: `fused_recurrent_gated_delta_rule` (initial /
final state) and `fused_recurrent_gated_delta_rule_update` (a state pool read and written in place).

A program per (sequence, group of V slices of one q/k head's value heads) keeps one [K, BV] slice of
the state at a time in registers, in fp32, and walks the sequence's tokens over it. Per token, with d = exp(g) and q
already scaled:
    h' = d h,   u = beta (v - h'^T k),   h = h' + k u^T,   o = h^T q = h'^T q + (q . k) u.
Both reductions over K read h' before the update, so they share one pass over the tile and the
update only writes. The state is read once and written once per call, whatever the token count:
decode is bound by that traffic, so the V slice and the warps are chosen for bandwidth (see
`launch_config`), with no autotuning. Measured on the H200 (bench/decode.py): 64 fp32 columns per
program at 4 warps, no cache-eviction hints, and the state addressed as one 64-bit base per program
plus 32-bit offsets within the slot (64-bit per-element addresses cost registers and occupancy)
took the pool update from 2.9 to 3.6 TB/s at B=256 (2026-11-29).

A decode step (one token per sequence, no cu_seqlens) is the serving hot path. There a program checks
its row once, normalises q and k once, and walks several slices in a loop that Triton pipelines (the
next slices' state loads go through shared memory while one slice updates; no registers held for
them). A walk may cover the slices of every value head that shares the program's q/k head, so that its
set-up (the slot checks, q and k) is paid once per more state. On the H200 (2026-12-03, B = 256,
bench/results/decode-walks4-2026-12-03.json) walks of four 64-column slices (both value heads of a q/k
head) took an fp32 pool 0.290 ms and a bf16 one 0.174 ms, against 0.305 / 0.181 for walks of two in the
same run: 1.67x, not the 2x a bf16 pool's bytes allow (ncu of the walk: issue-latency bound, and per state
element a bf16 walk executes about as many instructions as an fp32 one; bench/NOTES.md). Taking the
loaded tile as it is and scaling the column sums by the decay cut a slice's loop 1381 -> 1269 instructions
(bf16) and 680 -> 631 (fp32), and took the bf16 pool to 0.170 ms (0.048 at B = 64), the fp32 one
unchanged at 0.289 (2026-12-04, decode-loaded-state-ab-2026-12-04.json): 1.70x. A pool stored value-first
([slots, HV, V, K], state_v_first) comes as its transposed view: K is then the contiguous axis, its
slices are runs of whole K rows, and a bf16 pool took 0.152 ms, 1.89x (PIPELINED_BV below).

The token count is a runtime argument that Triton does not specialize, and no other argument changes
with it (token offsets are computed in the kernel from constexpr head counts and dims), so a new
length never compiles a new binary, except that a step of one token per sequence has its own
(ONE_TOKEN: the pipelined walk), shared by every batch size. The pool's strides are passed as they
are: they describe the pool, not the batch, and a pool may be a strided view into a larger cache.

The kernel checks the values a serving engine hands it, on the device, so that no call reads them on
the host (a device-to-host copy stalls the host every step): a pool slot out of [-1, slots) or one that
another row of the call also names gives that sequence NaN outputs and leaves the pool untouched;
cu_seqlens out of order anywhere or past the tokens (sequences would overlap) give every sequence NaN
outputs and NaN final states and leave the pool untouched. Rows that no sequence covers stay NaN too
(the output starts as NaN with cu_seqlens). Nothing is read or
written out of range whatever the values; the host checks that name the bad entry run on request
(GDN_VALUE_CHECKS=1). Finding a repeated slot costs each program one pass over the call's slot list
(N int32, from L2, a thread's worth per step): at B = 256, 1 KiB per program beside the 64 KiB of state
it reads and writes (about 1.6% of the bytes, by count).

These kernels have no backward: the triton backend serves both ops forward-only (`refuse_grad`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
import triton
import triton.language as tl

from gdn._validate import GdnShapes
from gdn.backends.triton._common import OpKernel, cdiv, next_power_of_2, processors
from gdn.backends.triton.common.tiles import cast_as
from gdn.backends.triton.launch import Constants, PreparedLaunch
from gdn.calls import GdnCall, PoolDecodeCall

L2NORM_EPS = tl.constexpr(1e-6)  # as the eager l2norm_fp32
# The widest V slice, and the state elements each thread holds. One warp per 128 x 32 tile (128 per
# thread) beat every other (BV, warps) of a sweep on the H200 (Triton 3.6, HV = 32, K = V = 128,
# 2026-12-01): at B = 64 / 256, 85 / 323 µs with an fp32 pool against 88 / 334 µs for 128 x 64 over
# 4 warps, and 60 / 240 µs against 72 / 280 µs with a bf16 pool; wider tiles and more warps were slower.
MAX_BV = 32
MIN_BV = 8
# State elements one program holds, whatever K is: at K = V = 256 a 256 x 32 tile over 2 warps spilled
# registers (ptxas for sm_90), a 256 x 16 tile over 1 warp does not.
MAX_TILE = 4096
ELEMENTS_PER_THREAD = 128
# Below this many programs per SM the GPU runs short of loads in flight: narrow the V slices.
PROGRAMS_PER_SM = 4
# Slot indices (and offsets) a program's threads read per step of the device-side checks: one each by
# default, which keeps the checks from taking registers from the state tile (a wider block spilled at
# 2 warps); `BLOCK_N` in OVERRIDES tries wider steps (fewer dependent reads before the state is written).
THREADS_PER_WARP = 32
# One token per sequence: slices of 64 columns over 4 warps for an fp32 state (64 state elements a
# thread) and over 2 warps for a half-precision one (128), a walk of up to four slices of one q/k head's
# value heads while that leaves about PIPELINED_PROGRAMS_PER_SM programs an SM, loads three slices deep.
# Swept on the H200 (Triton 3.6, HV = 32, K = V = 128, 2026-12-02, bench/results/decode-2026-12-02.json
# and decode-bf16-2026-12-02.json): at B = 256 an fp32 pool took 0.297 ms with walks of two, against
# 0.322 ms for one 128 x 32 slice per one-warp program (the layout before); 16-column walks on one warp
# were slower (0.46 ms). A bf16 pool took 0.181 ms (0.052 at B = 64) with 64 columns over 2 warps,
# against 0.194 (0.059) with 32 over 2: a bf16 row of 32 columns is four 16-byte vectors, so 8 lanes
# share each K column and both reductions over K shuffle 3 steps per column; at 64 columns 4 lanes do.
# The same layout loses with an fp32 pool at B = 256 (0.483 ms: twice the registers a thread). Walks of
# four (2026-12-03, decode-walks4-2026-12-03.json, one run): 0.290 / 0.174 ms at B = 256 against
# 0.305 / 0.181 for two and 0.291 / 0.191 for one (fp32 / bf16); at B = 64 (1024 programs, under 8 an
# SM) 0.080 / 0.050 against 0.082 / 0.052 for two; eight 32-column slices were slower on both pools. The slot scan
# reads one warp's worth of indices a step (PIPELINED_BLOCK_N): at 2 warps a step of 64 spilled 4 bytes
# of the bf16 walk's 255 registers (ptxas, sm_90), and 32 was as fast or faster on both pools (0.1772
# against 0.1815 ms bf16, 0.2967 against 0.2968 fp32 at B = 256).
# A value-first state ([.., V, K] in memory, K contiguous: fla's state_v_first, FlashInfer's bf16 layout)
# keeps a slice's 64 or 32 V rows as one contiguous block of whole K rows (256 bytes a row in bf16), where
# a key-first slice is 64 rows of 128 bytes strided by 256. On the H200 (2026-12-04,
# bench/results/decode-state-layout-2026-12-04.json and decode-floor-state-layout-2026-12-04.json) a bf16
# walk that only loads, scales and stores the state ran 0.142 ms value-first against 0.161 key-first at
# B = 256; the bf16 step is fastest value-first in slices of 32 columns over one warp (128 elements a
# thread), eight to a walk: 0.152 ms at B = 256 and 0.044 at B = 64, against 0.155 / 0.046 with the
# key-first choices and 0.171 / 0.049 on a key-first pool. An fp32 state ran the same in either layout
# (0.288 / 0.291 ms).
PIPELINED_BLOCK_N = THREADS_PER_WARP
PIPELINED_BV = {(4, False): 64, (2, False): 64, (4, True): 64, (2, True): 32}  # by (element size, value-first)
PIPELINED_ELEMENTS = {4: 64, 2: 128}  # by the state's element size
PIPELINED_MAX_SLICES = {(4, False): 4, (2, False): 4, (4, True): 4, (2, True): 8}
PIPELINED_PROGRAMS_PER_SM = 6
PIPELINED_STAGES = 3
# Benchmark knobs, e.g. OVERRIDES.update(BV=16, num_warps=2); any key of LaunchConfig.
OVERRIDES: dict[str, int] = {}


def refuse_grad(op: str, **tensors: torch.Tensor | None) -> None:
    """The serving kernels have no backward. A call that autograd would need to differentiate is an
    error rather than an output silently detached from its inputs."""
    if not torch.is_grad_enabled():
        return
    wanting = [name for name, t in tensors.items() if t is not None and t.requires_grad]
    if wanting:
        raise NotImplementedError(
            f"{op}: the triton backend runs this op forward only (inference), but {', '.join(wanting)} "
            "require grad; call it under torch.no_grad() / torch.inference_mode(), or use the eager "
            "backend for gradients"
        )


@triton.jit
def as_block(x, BLOCK: tl.constexpr):
    """The integer x (scalar) broadcast to [BLOCK] int64. Masks combine a scalar condition with a
    block only through this: the Triton 3.9 interpreter turns `block & scalar_bool` into an integer
    array that tl.load rejects."""
    return tl.zeros([BLOCK], dtype=tl.int64) + x


@triton.jit
def _token_qk(t, q_ptr, k_ptr, scale, i_h, o_k, H: tl.constexpr, K: tl.constexpr, L2NORM: tl.constexpr):
    """What token t gives every value head of q/k head i_h: q (normed, scaled), k (normed) and q . k."""
    mask_k = o_k < K
    b_q = tl.load(q_ptr + (t * H + i_h) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    b_k = tl.load(k_ptr + (t * H + i_h) * K + o_k, mask=mask_k, other=0.0).to(tl.float32)
    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + L2NORM_EPS)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + L2NORM_EPS)
    b_q = b_q * scale
    return b_q, b_k, tl.sum(b_q * b_k)


@triton.jit
def _token_inputs(
    t,
    q_ptr,
    k_ptr,
    g_ptr,
    beta_ptr,
    scale,
    i_h,
    i_hv,
    o_k,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    L2NORM: tl.constexpr,
):
    """What token t gives every V slice of its head: q (normed, scaled), k (normed), the decay exp(g),
    beta and q . k."""
    b_q, b_k, qk = _token_qk(t, q_ptr, k_ptr, scale, i_h, o_k, H, K, L2NORM)
    b_g = tl.load(g_ptr + t * HV + i_hv).to(tl.float32)
    b_beta = tl.load(beta_ptr + t * HV + i_hv).to(tl.float32)
    return b_q, b_k, tl.exp(b_g), b_beta, qk


@triton.jit
def _token_update(
    h, b_q, b_k, decay, b_beta, qk, t, v_ptr, o_ptr, i_hv, o_v, live, fill, HV: tl.constexpr, V: tl.constexpr
):
    """One token of the recurrence on the state slice h [BK, BV]; writes the token's output slice, or
    `fill` where the row is not served (`live` false)."""
    mask_v = o_v < V
    b_v = tl.load(v_ptr + (t * HV + i_hv) * V + o_v, mask=mask_v, other=0.0).to(tl.float32)
    # the decay scales the two column sums rather than the tile before them: the same products,
    # without a decayed copy of the tile live beside the loaded one
    hk = tl.sum(h * b_k[:, None], 0) * decay
    hq = tl.sum(h * b_q[:, None], 0) * decay
    b_u = b_beta * (b_v - hk)
    h = h * decay + b_k[:, None] * b_u[None, :]
    b_o = tl.where(live, hq + qk * b_u, fill)
    tl.store(o_ptr + (t * HV + i_hv) * V + o_v, cast_as(b_o, o_ptr), mask=mask_v)
    return h


@triton.jit
def slot_repeats(slots_ptr, i_n, slot, N, BLOCK_N: tl.constexpr):
    """How many other rows of the call name the same slot as row i_n."""
    count = 0
    for start in range(0, N, BLOCK_N):
        o_m = start + tl.arange(0, BLOCK_N)
        others = tl.load(slots_ptr + o_m, mask=o_m < N, other=-1).to(tl.int64)
        count += tl.sum(((others == slot) & (o_m != i_n)).to(tl.int32))
    return count


@triton.jit
def offsets_out_of_order(cu_ptr, N, T, BLOCK_N: tl.constexpr):
    """How many of 0 <= cu[0] <= cu[1] <= ... <= cu[N] <= T fail (counts, not bools: the Triton 3.2
    interpreter cannot negate an int1)."""
    bad = 0
    for start in range(0, N, BLOCK_N):
        o_m = start + tl.arange(0, BLOCK_N)
        lo = tl.load(cu_ptr + o_m, mask=o_m < N, other=0).to(tl.int64)
        hi = tl.load(cu_ptr + o_m + 1, mask=o_m < N, other=0).to(tl.int64)
        bad += tl.sum(((lo > hi) | (lo < 0) | (hi > T)).to(tl.int32))
    return bad


@triton.jit
def _tokens(
    h,
    bos,
    eos,
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    o_ptr,
    scale,
    i_h,
    i_hv,
    o_k,
    o_v,
    live,
    fill,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    L2NORM: tl.constexpr,
):
    """Tokens bos..eos of a row on the state slice h; a row that is not served only writes `fill`."""
    if live:
        for t in range(bos, eos):
            b_q, b_k, decay, b_beta, qk = _token_inputs(
                t, q_ptr, k_ptr, g_ptr, beta_ptr, scale, i_h, i_hv, o_k, H, HV, K, L2NORM
            )
            h = _token_update(h, b_q, b_k, decay, b_beta, qk, t, v_ptr, o_ptr, i_hv, o_v, live, fill, HV, V)
    else:
        for t in range(bos, eos):
            tl.store(o_ptr + (t * HV + i_hv) * V + o_v, cast_as((o_v * 0).to(tl.float32) + fill, o_ptr), mask=o_v < V)
    return h


@triton.jit(do_not_specialize=["T", "N", "SLOTS"])
def _recurrent_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    o_ptr,
    h0_ptr,
    ht_ptr,
    slots_ptr,
    cu_ptr,
    scale,
    T,
    N,
    SLOTS,
    stride_hn,
    stride_hh,
    stride_hk,
    stride_hv,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    SLICES: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_POOL: tl.constexpr,
    HAS_H0: tl.constexpr,
    STORE_HT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    ONE_TOKEN: tl.constexpr,
    L2NORM: tl.constexpr,
):
    """Grid (sequences, H * groups of SLICES V slices): sequences on axis 0, which has no 65535 limit. A
    group's slices belong to the value heads of one q/k head, NV slices each, in order.
    A program checks its row once and walks its slices. With one token per sequence (ONE_TOKEN) the
    walk is straight-line code per slice, so Triton pipelines it: the next slices' state loads are in
    flight (through shared memory) while one slice is updated."""
    NV: tl.constexpr = (V + BV - 1) // BV
    HG: tl.constexpr = HV // H  # value heads a q/k head serves
    NS: tl.constexpr = HG * NV  # V slices of one q/k head, over its value heads
    NG: tl.constexpr = (NS + SLICES - 1) // SLICES
    i_n = tl.program_id(0)
    i_h = tl.program_id(1) // NG
    first = (tl.program_id(1) % NG) * SLICES  # the program's first slice among the head's NS
    if IS_VARLEN:
        bos = tl.load(cu_ptr + i_n).to(tl.int64)
        eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
        # offsets out of order anywhere or past the tokens: sequences would overlap, so none gets any
        # tokens (the output stays NaN)
        out_of_order = offsets_out_of_order(cu_ptr, N, T, BLOCK_N)
        bos = tl.where(out_of_order == 0, bos, 0)
        eos = tl.where(out_of_order == 0, eos, 0)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
        out_of_order = i_n * 0
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    if USE_POOL:
        slot = tl.load(slots_ptr + i_n).to(tl.int64)
        in_range = (slot >= 0) & (slot < SLOTS)
        # The state load waits only on the slot being in range; the scans over the other rows (a
        # repeated slot, offsets out of order) decide whether anything is written, and run while the
        # state is on its way: gating the load on them left each program's load behind N / BLOCK_N
        # dependent reads. A padding slot (-1), one out of range and a sequence without tokens move
        # no state at all.
        load_k = mask_k & (as_block(in_range.to(tl.int64), BK) > 0) & (as_block(eos - bos, BK) > 0)
        row = tl.where(in_range, slot, 0)
        repeats = slot_repeats(slots_ptr, i_n, slot, N, BLOCK_N)
        wrong = (slot < -1).to(tl.int32) + (slot >= SLOTS).to(tl.int32) + out_of_order
        wrong += ((slot >= 0) & (repeats > 0)).to(tl.int32)
        live = (slot >= 0) & (wrong == 0)
        fill = tl.where(wrong > 0, float("nan"), 0.0)  # a refused slot or offsets: NaN outputs
        # a refused row (repeated slot, offsets out of order) leaves the pool untouched
        mask_k = load_k & (as_block(live.to(tl.int64), BK) > 0)
    else:
        live = True
        fill = 0.0  # every row of a plain call is served
        row = i_n.to(tl.int64)
        load_k = mask_k
    if ONE_TOKEN:  # q and k, shared by every slice of the walk
        b_q, b_k, qk = _token_qk(bos, q_ptr, k_ptr, scale, i_h, o_k, H, K, L2NORM)
    for j in tl.range(0, SLICES, num_stages=STAGES):
        i_s = first + j  # SLICES divides NS
        i_hv = i_h * HG + i_s // NV
        o_v = (i_s % NV) * BV + tl.arange(0, BV)
        state_base = row * stride_hn + i_hv.to(tl.int64) * stride_hh
        mask_load = load_k[:, None] & (o_v < V)[None, :]
        mask_h = mask_k[:, None] & (o_v < V)[None, :]
        p_h = o_k[:, None] * stride_hk + o_v[None, :] * stride_hv  # within one slot and head: 32-bit
        # loaded as it is, not added to zeros: 0 + x is not x for x = -0.0, so that add stays in the
        # binary, one instruction per state element
        if HAS_H0:
            h = tl.load(h0_ptr + state_base + p_h, mask=mask_load, other=0.0).to(tl.float32)
        else:
            h = tl.zeros([BK, BV], dtype=tl.float32)
        if ONE_TOKEN:
            # served or not, the row runs its step (a branch would stop the pipelining); an unserved
            # row writes `fill` and its state is never stored
            decay = tl.exp(tl.load(g_ptr + bos * HV + i_hv).to(tl.float32))
            b_beta = tl.load(beta_ptr + bos * HV + i_hv).to(tl.float32)
            h = _token_update(h, b_q, b_k, decay, b_beta, qk, bos, v_ptr, o_ptr, i_hv, o_v, live, fill, HV, V)
        else:
            h = _tokens(
                h, bos, eos, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, scale, i_h, i_hv, o_k, o_v, live, fill,
                H, HV, K, V, L2NORM,
            )  # fmt: skip
        if STORE_HT:
            if not USE_POOL:
                h = tl.where(as_block(out_of_order.to(tl.int64), BK)[:, None] == 0, h, float("nan"))
            tl.store(ht_ptr + state_base + p_h, h.to(ht_ptr.dtype.element_ty), mask=mask_h)


@dataclass(frozen=True)
class LaunchConfig:
    BK: int
    BV: int
    num_warps: int
    BLOCK_N: int
    # V slices one program walks, and the depth of the pipeline over them (one token per sequence)
    SLICES: int = 1
    STAGES: int = 1


def launch_config(
    N: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    device: torch.device,
    one_token: bool = False,
    state_bytes: int = 4,
    v_first: bool = False,
) -> LaunchConfig:
    """Several tokens per sequence: wide V slices (fewer redundant q/k loads) unless the grid would
    then be too small to keep the GPU's memory system busy, 128 state elements per thread, one slice per
    program. One token per sequence (a decode step), with a state of `state_bytes` per element, stored
    value-first (K contiguous) or not: the PIPELINED_* choices above.
    Decided once per (shape, SM count, OVERRIDES): a decode step calls this every token, and deciding
    each time cost 3 of the 20 µs of Python in front of a B = 1 kernel (measured on a CPU host,
    2026-12-01)."""
    return _launch_config(N, H, HV, K, V, processors(device), one_token, state_bytes, v_first, _overrides())


def _overrides() -> tuple:
    # a dict cannot key a cache; empty (the default) costs one truth test
    return tuple(sorted(OVERRIDES.items())) if OVERRIDES else ()


@functools.lru_cache(maxsize=256)
def _launch_config(
    N: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    sms: int,
    one_token: bool,
    state_bytes: int,
    v_first: bool,
    overrides: tuple,
) -> LaunchConfig:
    unknown = {name for name, _ in overrides} - {f.name for f in fields(LaunchConfig)}
    if unknown:
        raise KeyError(f"decode.OVERRIDES: unknown fields {sorted(unknown)}")
    BK = next_power_of_2(K)
    if one_token:
        size = state_bytes if state_bytes in PIPELINED_ELEMENTS else 4
        kind = (size, v_first)
        BV = min(PIPELINED_BV[kind], next_power_of_2(V))
        # the K-long q and k take registers too: past K = 128 a thread holds proportionally fewer state
        # elements (a bf16 walk at K = 256 with 128 a thread spilled 80 bytes, ptxas for sm_90)
        elements = PIPELINED_ELEMENTS[size] * 128 // max(128, BK)
        warps = max(1, min(8, BK * BV // (32 * elements)))
        cfg = LaunchConfig(BK=BK, BV=BV, num_warps=warps, BLOCK_N=PIPELINED_BLOCK_N)
        cfg = replace(cfg, **{name: value for name, value in overrides if name in ("BV", "num_warps")})
        # a walk covers slices of the value heads of one q/k head: a power of two that divides their count
        per_head = HV // H * cdiv(V, cfg.BV)
        slices = min(PIPELINED_MAX_SLICES[kind], per_head & -per_head)
        while slices > 1 and N * H * per_head // slices < PIPELINED_PROGRAMS_PER_SM * sms:
            slices //= 2
        cfg = replace(cfg, SLICES=slices, STAGES=PIPELINED_STAGES if slices > 1 else 1)
    else:
        BV = min(MAX_BV, next_power_of_2(V))
        wanted = PROGRAMS_PER_SM * sms
        while BV > MIN_BV and N * HV * cdiv(V, BV) < wanted:
            BV //= 2
        while BV > 1 and BK * BV > MAX_TILE:
            BV //= 2
        warps = max(1, min(8, BK * BV // (32 * ELEMENTS_PER_THREAD)))
        cfg = LaunchConfig(BK=BK, BV=BV, num_warps=warps, BLOCK_N=0)
    cfg = replace(cfg, **dict(overrides))
    per_head = HV // H * cdiv(V, cfg.BV)
    if per_head % cfg.SLICES:
        raise ValueError(
            f"decode.OVERRIDES: SLICES={cfg.SLICES} must divide the {per_head} V slices of a q/k head's "
            f"value heads (HV // H = {HV // H} heads of {cdiv(V, cfg.BV)} slices of BV={cfg.BV})"
        )
    return cfg if cfg.BLOCK_N else replace(cfg, BLOCK_N=THREADS_PER_WARP * cfg.num_warps)


@functools.lru_cache(maxsize=256)
def _step(
    N: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    sms: int,
    state_bytes: int,
    v_first: bool,
    one_token: bool,
    flags: tuple[bool, ...],
    overrides: tuple,
) -> tuple[tuple[int, int], Constants]:
    """The grid and the constexprs of a launch, decided once per configuration: a decode step needs them
    every token, and reading sixteen keywords per launch into the launch key cost the B = 1 step more
    host time than its kernel's own launcher (measured on a CPU host with the launcher stubbed out).
    Not keyed by T: a prefill of another length reuses them. `flags`: as _constants takes them."""
    cfg = _launch_config(N, H, HV, K, V, sms, one_token, state_bytes, v_first, overrides)
    grid = (N, H * cdiv(HV // H * cdiv(V, cfg.BV), cfg.SLICES))
    return grid, _constants(H, HV, K, V, cfg, one_token, flags)


@functools.lru_cache(maxsize=256)
def _constants(
    H: int, HV: int, K: int, V: int, cfg: LaunchConfig, one_token: bool, flags: tuple[bool, bool, bool, bool, bool]
) -> Constants:
    """One object per distinct set of constexprs, whatever the batch: the launch key holds it by identity,
    so batches of another size that choose the same configuration share its binary. `flags`: whether
    the launch reads a pool, reads an initial state, stores a final state, is packed, normalises q/k."""
    use_pool, has_h0, store_ht, is_varlen, l2norm = flags
    return Constants(
        H=H,
        HV=HV,
        K=K,
        V=V,
        BK=cfg.BK,
        BV=cfg.BV,
        SLICES=cfg.SLICES,
        STAGES=cfg.STAGES,
        BLOCK_N=cfg.BLOCK_N,
        USE_POOL=use_pool,
        HAS_H0=has_h0,
        STORE_HT=store_ht,
        IS_VARLEN=is_varlen,
        ONE_TOKEN=one_token,
        L2NORM=l2norm,
        num_warps=cfg.num_warps,
    )


def _launch(
    q,
    k,
    v,
    g,
    beta,
    shapes: GdnShapes,
    scale: float,
    cu_seqlens,
    l2norm: bool,
    h0,
    ht,
    slots,
    state_strides,
    pool_slots: int = 0,
) -> torch.Tensor:
    q, k, v, g, beta = q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous()
    state_bytes = (h0 if h0 is not None else ht if ht is not None else v).element_size()
    pool = slots is not None
    flags = (pool, h0 is not None, ht is not None, cu_seqlens is not None, l2norm)
    run = _launcher(shapes, scale, cu_seqlens, flags, state_strides, pool_slots, q.device, state_bytes)
    return run(q, k, v, g, beta, slots, h0, ht)


def _launcher(
    shapes: GdnShapes,
    scale: float,
    cu_seqlens,
    flags: tuple[bool, bool, bool, bool, bool],
    state_strides,
    pool_slots: int,
    device: torch.device,
    state_bytes: int,
) -> Callable[..., torch.Tensor]:
    """What a launch decides from everything but its tensors: run(q, k, v, g, beta, slots, h0, ht) -> o
    allocates the output and launches, for tensors of the metadata it was decided for (h0 / ht the
    state's strides; None where `flags` say there is none). A prepared step keeps one for its calls and
    holds no tensor but cu_seqlens. `flags`: as _constants takes them."""
    one_token = shapes.T == 1 and cu_seqlens is None
    sms = processors(device)
    v_first = state_strides[2] == 1 and state_strides[3] != 1  # K contiguous: [.., V, K] in memory
    grid, constants = _step(
        shapes.N, shapes.H, shapes.HV, shapes.K, shapes.V, sms, state_bytes, v_first, one_token, flags, _overrides()
    )
    tail = (scale, shapes.T, shapes.N, pool_slots if flags[0] else 0, *state_strides)
    kernel = PreparedLaunch(_recurrent_kernel, grid, constants, tail, device)

    if cu_seqlens is None:

        def run(q, k, v, g, beta, slots, h0, ht) -> torch.Tensor:
            o = torch.empty_like(v)
            kernel(q, k, v, g, beta, o, h0, ht, slots, None)
            return o

        return run

    def packed_run(q, k, v, g, beta, slots, h0, ht) -> torch.Tensor:
        o = torch.full_like(v, float("nan"))  # rows that no (valid) sequence covers keep NaN
        kernel(q, k, v, g, beta, o, h0, ht, slots, cu_seqlens)
        return o

    return packed_run


def _dense_state(state: torch.Tensor, v_first: bool) -> torch.Tensor:
    """state [N, HV, K, V] dense in its memory layout: [.., V, K] (K contiguous) where v_first."""
    if v_first:
        return state.transpose(-1, -2).contiguous().transpose(-1, -2)
    return state.contiguous()


def fused_recurrent_gated_delta_rule(call: GdnCall):
    """The `fused_recurrent_gated_delta_rule` op of the triton backend (forward only). Returns
    (o [B, T, HV, V] in v's dtype, final state [N, HV, K, V] fp32 or None). With state_v_first the
    states are read and written in the user's [.., V, K] storage: the final state is its transposed
    view, so the public op returns it without a copy."""
    q, k, v, g, beta, initial_state = call.q, call.k, call.v, call.g, call.beta, call.initial_state
    refuse_grad("fused_recurrent_gated_delta_rule", q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    shapes = call.shapes
    N, HV, K, V = shapes.N, shapes.HV, shapes.K, shapes.V
    v_first = call.state_v_first
    h0 = None if initial_state is None else _dense_state(initial_state, v_first)
    ht = None
    if call.output_final_state:
        ht = torch.empty(N, HV, *((V, K) if v_first else (K, V)), dtype=torch.float32, device=q.device)
        ht = ht.transpose(-1, -2) if v_first else ht
    o = _launch(
        q,
        k,
        v,
        g,
        beta,
        shapes,
        call.scale,
        call.cu_seqlens,
        call.use_qk_l2norm_in_kernel,
        h0,
        ht,
        None,
        (HV * K * V, K * V, 1, K) if v_first else (HV * K * V, K * V, V, 1),  # h0 and ht: dense, one layout
    )
    return o, ht


def fused_recurrent_gated_delta_rule_update(call: PoolDecodeCall):
    """The `fused_recurrent_gated_delta_rule_update` op of the triton backend (forward only):
    sequence n reads and writes ssm_pool[ssm_indices[n]] in place; index -1 gives zero outputs and
    leaves the pool untouched; a slot out of range or repeated gives NaN outputs and leaves the pool
    untouched. Returns o [B, T, HV, V] in v's dtype."""
    q, k, v, g, beta, pool = call.q, call.k, call.v, call.g, call.beta, call.ssm_pool
    refuse_grad("fused_recurrent_gated_delta_rule_update", q=q, k=k, v=v, g=g, beta=beta)
    return _launch(
        q,
        k,
        v,
        g,
        beta,
        call.shapes,
        call.scale,
        call.cu_seqlens,
        call.use_qk_l2norm_in_kernel,
        pool,
        pool,
        call.ssm_indices,
        pool.stride(),
        pool_slots=pool.shape[0],
    )


def prepare_pool_update(call: PoolDecodeCall) -> Callable[..., torch.Tensor]:
    """The prepared step of `fused_recurrent_gated_delta_rule_update` (gdn.prepared, gdn.dispatch):
    step(q, k, v, g, beta, ssm_pool, ssm_indices) -> o for tensors that match `call`'s in type, shape,
    dtype, device and strides (the caller checks that), with `call`'s options. The launch's
    configuration, grid and constants are decided here once; a step allocates the output and launches.
    The step holds no tensor (the pool comes with each step: a cached step never keeps a pool alive). The
    kernel checks the indices itself, as on the op's own path; a step that needs gradients never comes
    here (the caller makes the public call, which serves it eager)."""
    pool = call.ssm_pool
    flags = (True, True, True, call.cu_seqlens is not None, call.use_qk_l2norm_in_kernel)
    run = _launcher(
        call.shapes,
        call.scale,
        call.cu_seqlens,
        flags,
        pool.stride(),
        pool.shape[0],
        call.q.device,
        pool.element_size(),
    )
    if all(t.is_contiguous() for t in (call.q, call.k, call.v, call.g, call.beta, call.ssm_indices)):

        def step(q, k, v, g, beta, ssm_pool, ssm_indices) -> torch.Tensor:
            return run(q, k, v, g, beta, ssm_indices, ssm_pool, ssm_pool)

        return step  # a step's tensors have the prepared strides: dense too

    def strided_step(q, k, v, g, beta, ssm_pool, ssm_indices) -> torch.Tensor:
        q, k, v, g, beta, ssm_indices = (t.contiguous() for t in (q, k, v, g, beta, ssm_indices))
        return run(q, k, v, g, beta, ssm_indices, ssm_pool, ssm_pool)

    return strided_step


# how gdn.prepared finds it: an implementation's own prepared step
fused_recurrent_gated_delta_rule_update.prepare = prepare_pool_update

# The ops this module serves (TritonBackend.loader): serving kernels without a backward, which check the
# pool's slots and the offsets on the device, so that a serving step never reads them on the host; no
# matmul, so a few fp32 ulps from eager.
OPS = {
    op: OpKernel(implementation, forward_only=True, guards_values=True, probe_tolerance=1e-5)
    for op, implementation in (
        ("fused_recurrent_gated_delta_rule", fused_recurrent_gated_delta_rule),
        ("fused_recurrent_gated_delta_rule_update", fused_recurrent_gated_delta_rule_update),
    )
}
