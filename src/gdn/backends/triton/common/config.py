"""Tile sizes and launch widths of the chunk stages: a function of the head dims only (model
constants), so a new sequence length never picks a new configuration, and nothing is autotuned on a
first call.

The defaults are a heuristic for Hopper-class GPUs. `OVERRIDES` lets a benchmark try others without
editing code (`config.OVERRIDES.update(state_bv=64)`); every field is a Tiles field."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import triton
from packaging.version import Version

from gdn.backends.triton._common import cdiv, is_interpreting, next_power_of_2, processors

# The chunk length is part of the algorithm's tiling: the WY inverse is built from 4 x 4 blocks of 16.
CHUNK = 64
SUB_CHUNK = 16

OVERRIDES: dict[str, int] = {}

# Splitting a sequence costs a pass over each segment for its summary (the state it leaves from zero
# and the K x K map of the state entering it: twice the work of the plain pass; the backward takes its
# maps from the forward's) and a combine along the segments: three (backward: two) times the plain
# pass's work, which pays only where idle SMs can take it. At K = 128 with 32-wide slices on sm_90 the
# forward pass takes 139 registers a thread (three programs of 4 warps fit an SM), the backward 212
# (two): if a program's speed is its latency chain, that about breaks even, but if co-resident
# programs overlap better than that, the split wins. Off by default until the H200 measures it (bench/chunk.py --sweep
# sets segment_programs); split_backward = 0 splits the forward passes only.
SEGMENT_CHUNKS = 8
SEGMENT_PROGRAMS = 0
# The combine holds a segment's K x K map (fp32) for its product: at K = 256 that asked for 576 KiB of
# shared memory (ptxas for sm_90, 3 stages; 256 KiB even at 1) where an H200 SM has 227 KiB.
MAX_SPLIT_KP = 128


@dataclass(frozen=True)
class Tiles:
    BK: int  # K slice of the chunk-parallel stages
    BV: int  # V slice of the chunk-parallel stages
    KP: int  # K padded to a power of two: the state passes hold all of K
    state_bv: int  # V slice of one state-pass program (the pass runs sequence x value head x V slice)
    state_bv_short: int  # the V slice when state_bv would leave SMs without a program (see state_slice)
    output_bv: int
    wy_bwd_bk: int  # K slice of the WY backward
    prepare_warps: int
    wu_warps: int
    state_warps: int
    combine_warps: int  # the split state passes' combine holds a K x K map of fp32
    output_warps: int
    dv_warps: int
    dqkwg_warps: int
    wy_bwd_warps: int
    num_stages: int
    state_stages: int  # software pipelining of the state passes' loop over chunks
    state_bwd_stages: int  # the same in the backward pass, which buffers more per stage
    segment_chunks: int  # shortest segment (in chunks) where the state passes split a sequence
    segment_programs: int  # programs per SM that splitting aims at; 0 never splits
    split_backward: int  # whether the backward's state pass splits too (where the forward's does)


def _padded(n: int) -> int:
    return max(16, next_power_of_2(n))  # tl.dot needs every dimension >= 16


def tiles_for(K: int, V: int, element_size: int) -> Tiles:
    """Tiles for head dims K, V and inputs of element_size bytes (2 for bf16/fp16, 4 for fp32)."""
    KP, VP = _padded(K), _padded(V)
    tiles = _interpreter_tiles(KP, VP) if is_interpreting() else _gpu_tiles(KP, VP, element_size)
    unknown = set(OVERRIDES) - {f.name for f in fields(Tiles)}
    if unknown:
        raise KeyError(f"config.OVERRIDES: unknown fields {sorted(unknown)}")
    return replace(tiles, **OVERRIDES)


def _interpreter_tiles(KP: int, VP: int) -> Tiles:
    """The interpreter's cost is per operation, not per element: whole-head tiles, fewest programs."""
    warps = {f.name: 1 for f in fields(Tiles) if f.name.endswith("_warps")}
    return Tiles(
        BK=KP,
        BV=VP,
        KP=KP,
        state_bv=VP,
        state_bv_short=VP,
        output_bv=VP,
        wy_bwd_bk=KP,
        num_stages=1,
        state_stages=1,
        state_bwd_stages=1,
        segment_chunks=SEGMENT_CHUNKS,
        segment_programs=SEGMENT_PROGRAMS,
        split_backward=1,
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
    return Tiles(
        BK=min(64, KP),
        BV=min(64, VP),
        KP=KP,
        # The state passes are sequential over chunks: wide V slices load w, k and q once for more
        # columns, narrow ones give a short grid (one sequence: HV x V slices programs) more SMs.
        state_bv=min(64, VP),
        state_bv_short=min(32, VP),
        output_bv=min(128, VP),
        wy_bwd_bk=min(64, KP),
        prepare_warps=1,
        wu_warps=4,
        state_warps=4,
        combine_warps=wide,
        output_warps=4,
        dv_warps=4,
        dqkwg_warps=wide,
        wy_bwd_warps=4 if sixteen_bit else wide,
        num_stages=stages,
        state_stages=stages,
        state_bwd_stages=bwd_stages,
        segment_chunks=SEGMENT_CHUNKS,
        segment_programs=SEGMENT_PROGRAMS,
        split_backward=1,
    )


def narrow_slice_warps(warps: int, *slices: int) -> int:
    """At most 4 warps when a slice is narrower than 32: with 16-wide slices, 8 warps made qk_grads
    fault (illegal memory access) and the WY backward return wrong fp32 gradients on the H200
    (Triton 3.6), while 4 are correct."""
    return warps if min(slices) >= 32 else min(warps, 4)


def state_slice(tiles: Tiles, sequences_x_heads: int, V: int, device) -> int:
    """The V slice of the state passes: tiles.state_bv while the grid still covers every SM, else
    tiles.state_bv_short. Depends on the batch, never on the sequence length."""
    if sequences_x_heads * cdiv(V, tiles.state_bv) >= processors(device):
        return tiles.state_bv
    return tiles.state_bv_short


def could_split(tiles: Tiles, heads: int, V: int, device) -> bool:
    """Whether one sequence of these heads would have its state passes split (`segment_length` of a
    long enough sequence is not 0): the kernel classes whose first call compiles the split's kernels."""
    return (
        tiles.segment_programs > 0
        and tiles.KP <= MAX_SPLIT_KP
        and heads * cdiv(V, tiles.state_bv_short) < processors(device)
    )


def segment_length(tiles: Tiles, sequences_x_heads: int, V: int, longest: int, device) -> int:
    """Chunks per segment where the state passes split the sequences, or 0 where they do not: only when
    one program per sequence, head and V slice leaves SMs without a program, and only sequences longer
    than one segment. A function of the batch, the heads and the longest sequence's chunk count; the
    kernels take segment lengths as runtime arguments, so no length compiles a binary of its own."""
    programs = sequences_x_heads * cdiv(V, tiles.state_bv_short)
    if tiles.segment_programs == 0 or tiles.KP > MAX_SPLIT_KP or programs >= processors(device):
        return 0
    wanted = cdiv(tiles.segment_programs * processors(device), programs)
    length = max(tiles.segment_chunks, cdiv(longest, wanted))
    return length if longest > length else 0
