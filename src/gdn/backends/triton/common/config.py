"""Tile sizes and launch widths of the chunk stages: a function of the head dims only (model
constants), so a new sequence length never picks a new configuration, and nothing is autotuned on a
first call.

The defaults are a heuristic for Hopper-class GPUs. `OVERRIDES` lets a benchmark try others without
editing code (`config.OVERRIDES.update(state_bv=64)`); every field is a Tiles field."""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

import triton
from packaging.version import Version

from gdn.backends.triton._common import cdiv, is_interpreting, next_power_of_2, processors
from gdn.backends.triton.chunk_index import ChunkPlan

# The chunk length is part of the algorithm's tiling: the WY inverse is built from 4 x 4 blocks of 16.
CHUNK = 64
SUB_CHUNK = 16

OVERRIDES: dict[str, int] = {}

# Splitting a sequence costs a pass over each segment for its summary (the state it leaves from zero
# and the K x K map of the state entering it; the backward takes its maps from the forward's) and a
# combine along the segments: about twice the plain pass's work, which pays only where most SMs would
# idle. Measured on the H200 (bench/chunk.py --sweep --shape, 2026-12-02; one sequence of 32,768 tokens,
# bf16, K = V = 128; fwd+bwd summed kernel time): with 32 value heads (128 programs of 32-wide slices)
# the split lost at 2, 3 and 4 programs per SM (2.10 -> 2.83-3.02 ms at 8,192 tokens) and 16-wide
# slices lost too; with 16 heads 16-wide slices won (5.32 -> 4.82 ms) and the split lost (5.93); with 8
# heads the split (3.39) and 16-wide slices (3.38) both won over 3.92; with 4 heads the split won
# most (3.37 -> 2.00). Hence the slice and split rule in state_slice and could_split below.
SEGMENT_CHUNKS = 8
SEGMENT_PROGRAMS = 2
# The split is compiled (sm_90) and timed only up to K = 128: the combine holds a segment's whole K x K
# fp32 map (64 KiB a pipeline stage at K = 128); at K = 256 one map alone would be 256 KiB, over the
# 227 KiB of an H200 SM.
MAX_SPLIT_KP = 128
# A split sequence's segments: at most WALK (the combine walks them in order), in 64-column slices
# (state_bv) where those still give about one program per SM, else 32 (state_bv_short). Measured on the
# H200 (2026-12-02, one sequence of 32,768 tokens, bf16, K = V = 128, fwd+bwd summed kernel time, the
# whole-map combine): 2 value heads 0.995 ms at 33 segments of 32 columns, 0.868 at 16 of 64, 0.814 at
# 16 of 32; 4 value heads 1.496 at 17 of 32, 1.474 at 33 of 64, 1.457 at 16 of 32, 1.269 at 16 of 64;
# 8 value heads 2.96 at 17 of 32, 2.74 at 9 of 64, 2.41 at 17 of 64.
WALK = 16


@dataclass(frozen=True)
class Tiles:
    BK: int  # K slice of the chunk-parallel stages
    BV: int  # V slice of the chunk-parallel stages
    KP: int  # K padded to a power of two: the state passes hold all of K
    state_bv: int  # V slice of one state-pass program (the pass runs sequence x value head x V slice)
    state_bv_short: int  # the V slice when state_bv would leave SMs without a program (see state_slice)
    state_bv_narrow: int  # the V slice when even state_bv_short would leave most SMs idle
    output_bv: int
    wy_bwd_bk: int  # K slice of the WY backward
    wy_bwd_out_bk: int  # K slice of its dq / dk pass (the whole K up to 128: the l2norm's backward there)
    qk_grads_bk: int  # K slice of qk_grads (the whole K up to 128)
    prepare_warps: int
    wu_warps: int
    state_warps: int
    combine_bv: int  # V slice of the combine, whatever the split passes' slice (its own grid)
    combine_warps: int
    combine_stages: int  # software pipelining of the combine's walk (the next maps load while one multiplies)
    output_warps: int
    dv_warps: int
    dqkwg_warps: int
    wy_bwd_warps: int
    num_stages: int
    state_stages: int  # software pipelining of the state passes' loop over chunks
    state_bwd_stages: int  # the same in the backward pass, which buffers more per stage
    output_in_state_bv: int  # the narrowest state-pass slice whose forward writes the output itself; 0 never
    # the split's knobs: the same for the interpreter and every GPU, changed only by OVERRIDES
    segment_chunks: int = SEGMENT_CHUNKS  # shortest segment (in chunks) where the state passes split a sequence
    segment_programs: int = SEGMENT_PROGRAMS  # programs per SM that splitting aims at; 0 never splits
    split_backward: int = 1  # whether the backward's state pass splits too (where the forward's does)


def _padded(n: int) -> int:
    return max(16, next_power_of_2(n))  # tl.dot needs every dimension >= 16


def tiles_for(K: int, V: int, element_size: int) -> Tiles:
    """Tiles for head dims K, V and inputs of element_size bytes (2 for bf16/fp16, 4 for fp32)."""
    if OVERRIDES:  # checked only where set: every chunk call asks for its tiles
        unknown = set(OVERRIDES) - {f.name for f in fields(Tiles)}
        if unknown:
            raise KeyError(f"config.OVERRIDES: unknown fields {sorted(unknown)}")
    return _tiles(_padded(K), _padded(V), element_size, is_interpreting(), tuple(sorted(OVERRIDES.items())))


@functools.cache
def _tiles(KP: int, VP: int, element_size: int, interpreting: bool, overrides: tuple) -> Tiles:
    # every call asks (a chunk call two or three times): kept, as it only follows its arguments
    tiles = _interpreter_tiles(KP, VP) if interpreting else _gpu_tiles(KP, VP, element_size)
    return replace(tiles, **dict(overrides))


def _interpreter_tiles(KP: int, VP: int) -> Tiles:
    """The interpreter's cost is per operation, not per element: whole-head tiles, fewest programs."""
    warps = {f.name: 1 for f in fields(Tiles) if f.name.endswith("_warps")}
    return Tiles(
        BK=KP,
        BV=VP,
        KP=KP,
        state_bv=VP,
        state_bv_short=VP,
        state_bv_narrow=VP,
        output_bv=VP,
        combine_bv=VP,
        wy_bwd_bk=KP,
        wy_bwd_out_bk=KP,
        qk_grads_bk=KP,
        num_stages=1,
        state_stages=1,
        state_bwd_stages=1,
        combine_stages=1,
        output_in_state_bv=16,  # every slice: the CPU tests take the fused forward (one sets 0)
        **warps,
    )


def _gpu_tiles(KP: int, VP: int, element_size: int) -> Tiles:
    # The qk_grads kernel has the most live [64, 64] accumulators and spills at 4 warps; 8 warps crash
    # the NVIDIA compiler of Triton 3.2 (LinearLayout assertion) and 3.3 (pass pipeline failure).
    wide = 8 if Version(triton.__version__).release >= (3, 4) else 4
    # Measured on the H200 at the benchmark shapes (bf16, fwd+bwd): 3 pipeline stages are 3-10% faster
    # than 2 in the state passes and 2-4% in the others, the WY backward at 4 warps 4-5% faster than
    # at 8, and prepare at 1 warp 7-8% faster than at 4 (its dots are 16 x 16 blocks, its forward
    # substitution a chain of them: more warps only add synchronisation). fp32 inputs failed at 3
    # stages on the H200 (K=100 and K=128 test cases) and keep the WY backward at `wide` warps, which their
    # tests passed with; 4 was not timed for fp32.
    sixteen_bit = element_size <= 2
    stages = 3 if sixteen_bit else 2
    # The state backward holds all of K: at K = 256 its pipeline buffers asked for 316 KiB (bf16, 3
    # stages) and 361 KiB (fp32, 2) of shared memory (ptxas for sm_90), over the 227 KiB of an H200 SM,
    # so no launch could run; one stage fewer fits (209 / 147 KiB).
    bwd_stages = stages if KP <= 128 else stages - 1
    # The forward's state pass writing the output as it goes (no h, no v_new stored, no output kernel)
    # adds q's [64, K] tile to each pipeline stage and three products to each chunk's step. Measured on
    # the H200 (2026-12-04, bf16, K = V = 128, state pass + output kernel summed against the fused
    # pass): 0.478 -> 0.401 ms with 64-column slices (4 x 4096 tokens, 32 value heads), but 0.270 ->
    # 0.348 with 32-column ones (one sequence of 8,192) and 1.09 -> 1.39 (32,768, unsplit), where few
    # programs run the sequential chain and each recomputes q k^T for a narrow slice. Forming v_new there
    # from (I + A)^-1 rather than reading w and u (no WU kernel in the forward): 2.93 -> 2.80 ms fwd+bwd
    # at (4, 4096). ptxas (sm_90): 165 KiB of shared memory at K = 128, 3 stages; K = 256 or fp32 tiles
    # would not fit.
    output_in_state_bv = 64 if sixteen_bit and KP <= 128 else 0
    return Tiles(
        BK=min(64, KP),
        BV=min(64, VP),
        KP=KP,
        # The state passes are sequential over chunks: wide V slices load w, k and q once for more
        # columns, narrow ones give a short grid (one sequence: HV x V slices programs) more SMs.
        state_bv=min(64, VP),
        state_bv_short=min(32, VP),
        state_bv_narrow=min(16, VP),
        output_bv=min(128, VP),
        # the combine holds a K x K map beside its [K, combine_bv] state: 64 columns spilled 164 bytes
        # at K = 128 (ptxas, sm_90), 32 spill 16
        combine_bv=min(32, VP),
        wy_bwd_bk=min(64, KP),
        wy_bwd_out_bk=KP if KP <= 128 else 64,
        # one value head a program holds three [64, K] fp32 accumulators: 251 registers and no spills at
        # K = 128 over 8 warps (ptxas, sm_90); wider K in 128-column slices
        qk_grads_bk=min(128, KP),
        prepare_warps=1,
        wu_warps=4,
        state_warps=4,
        combine_warps=wide,
        combine_stages=2,
        output_warps=4,
        dv_warps=4,
        dqkwg_warps=wide,
        wy_bwd_warps=4 if sixteen_bit else wide,
        num_stages=stages,
        state_stages=stages,
        state_bwd_stages=bwd_stages,
        output_in_state_bv=output_in_state_bv,
    )


def stage_constants(plan: ChunkPlan, tiles: Tiles, fp32_dot: str | None, **dims: int) -> dict[str, object]:
    """A chunk stage's launch keywords that every stage passes alike: its dims (heads, key and value
    widths, as the stage names them), the chunk, the plan's packing flag (a runtime flag: a dense and a
    packed call launch one binary), the products' precision and the pipeline depth."""
    return dict(dims, BT=CHUNK, IS_VARLEN=int(plan.is_varlen), FP32_DOT=fp32_dot, num_stages=tiles.num_stages)


def narrow_slice_warps(warps: int, *slices: int) -> int:
    """At most 4 warps when a slice is narrower than 32: with 16-wide slices, 8 warps made qk_grads
    fault (illegal memory access) and the WY backward return wrong fp32 gradients on the H200
    (Triton 3.6), while 4 are correct."""
    return warps if min(slices) >= 32 else min(warps, 4)


def state_slice(tiles: Tiles, sequences_x_heads: int, heads: int, V: int, device) -> int:
    """The V slice of a whole (unsplit) state pass: tiles.state_bv while the grid still covers every SM;
    where the batch's long sequences would split, the split's (split_slice: a class shares its
    binaries between its split and whole calls); tiles.state_bv_short while the grid covers three
    quarters of the SMs; else tiles.state_bv_narrow. Depends on the batch, never on the sequence
    length."""
    sms = processors(device)
    if sequences_x_heads * cdiv(V, tiles.state_bv) >= sms:
        return tiles.state_bv
    if could_split(tiles, sequences_x_heads, V, device):
        return split_slice(tiles, heads, V, device)
    if 4 * sequences_x_heads * cdiv(V, tiles.state_bv_short) >= 3 * sms:
        return tiles.state_bv_short
    return tiles.state_bv_narrow


def split_slice(tiles: Tiles, heads: int, V: int, device) -> int:
    """The V slice where a batch of `heads` value heads splits its long sequences: tiles.state_bv where
    one sequence's WALK segments in it give at least seven eighths of a program per SM, else
    tiles.state_bv_short. Read for one sequence whatever the batch, so that every call of a kernel
    class that splits takes the same binaries."""
    if 8 * WALK * heads * cdiv(V, tiles.state_bv) >= 7 * processors(device):
        return tiles.state_bv
    return tiles.state_bv_short


def could_split(tiles: Tiles, sequences_x_heads: int, V: int, device) -> bool:
    """Whether the state passes split sequences of this batch and heads that are long enough (in
    state_bv_short slices): where one program per sequence, head and slice would leave more than five
    eighths of the SMs idle. For one sequence, the kernel classes whose first call compiles the split's
    kernels."""
    programs = sequences_x_heads * cdiv(V, tiles.state_bv_short)
    return tiles.segment_programs > 0 and tiles.KP <= MAX_SPLIT_KP and 8 * programs < 3 * processors(device)


def segment_length(tiles: Tiles, sequences_x_heads: int, heads: int, V: int, longest: int, device) -> int:
    """Chunks per segment where the state passes split the sequences (aiming at tiles.segment_programs
    programs per SM, at most WALK segments a sequence), or 0 where they do not, and for sequences within
    one segment. A function of the batch, the heads and the longest sequence's chunk count; the kernels
    take segment lengths as runtime arguments, so no length compiles a binary of its own."""
    if not could_split(tiles, sequences_x_heads, V, device):
        return 0
    programs = sequences_x_heads * cdiv(V, split_slice(tiles, heads, V, device))
    wanted = min(WALK, cdiv(tiles.segment_programs * processors(device), programs))
    length = max(tiles.segment_chunks, cdiv(longest, wanted))
    return length if longest > length else 0
