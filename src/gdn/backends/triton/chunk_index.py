"""Where the chunks of a batch lie: the grid of the chunk-parallel kernels and, for packed sequences
(cu_seqlens), the tables that map a program to its sequence; and how the state passes split the
sequences into segments.

Chunks are numbered sequence by sequence. The chunk-parallel kernels put that number on grid axis 0,
which has no 65535 limit, so a batch of many short sequences launches like one long sequence.

A packed batch's tables are computed on the device from cu_seqlens (`plan_chunks`: two small kernels),
so that a packed call reads nothing on the host and can be captured in a CUDA graph. Its grid takes an
upper bound of the chunks that needs no value: N sequences of T tokens in all have at most T // 64 + N
chunks (each sequence's last chunk is at most one more than its tokens fill). The rows past the last
chunk are read as chunks past the last sequence's end: every chunk-parallel kernel ends such a program
before it reads anything. The same kernels check the offsets: out of order, or not from 0 to T, they
plan sequence 0 over every token and the others empty, and set a flag on which the state passes start
from a NaN state, so that every output, final state and gradient is NaN and nothing is read or written
out of range (the host check, which names the bad entry, runs only on request: GDN_VALUE_CHECKS=1).
Only where the state passes could split a sequence (few sequences and heads: config.could_split) does a
packed call read its tables back to the host, to cut the sequences into segments."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import cdiv, device_guard
from gdn.backends.triton.compile_ahead import compiling_only
from gdn.backends.triton.launch import launch

# sequences a step of the offsets kernel reads, and chunk rows a program of the rows kernel locates
TABLE_BLOCK = 1024
# table lengths in the device buffer are padded to 16 bytes: a kernel specializes on its pointers'
# alignment, and a table's offset in the buffer must not depend on the number of sequences
_ALIGN = 4


@dataclass(frozen=True)
class Segments:
    """Runs of whole chunks of one sequence, numbered sequence by sequence, so that a segment's chunks
    keep their rows in the per-chunk buffers. The state passes run one program per segment (and head
    and V slice); a sequence split in several segments is intra-sequence parallelism, one segment per
    sequence is the plain sequential pass.

    A dense batch's segments are arithmetic (every sequence has `per_sequence` of `tokens` tokens, the
    last one shorter), so that its launches read no table and copy nothing to the device; a packed
    batch's are tables."""

    count: int
    per_sequence: int  # dense: segments per sequence
    tokens: int  # dense: tokens per segment, a multiple of the chunk
    bounds: torch.Tensor  # packed: [count + 1] int32, token bounds; dense: empty
    chunk_offsets: torch.Tensor  # packed: [count + 1] int32, first chunk of each segment; dense: empty
    first: torch.Tensor  # packed: [N + 1] int32, first segment of each sequence; dense: empty


@dataclass(frozen=True)
class ChunkPlan:
    """For packed sequences the tables below; for a dense batch they are empty int32 tensors on its
    device, so that the kernels take the same pointer arguments (a runtime flag says which) and a
    dense call and a packed one launch the same binaries."""

    num_sequences: int
    num_chunks: int  # rows of the chunk grid: dense, every chunk; packed, T // chunk + N (an upper bound)
    longest: int | None  # chunks of the longest sequence; packed: None until read back (`read_back`)
    cu_seqlens: torch.Tensor  # [N + 1] int32, the offsets the kernels read (checked: module docstring)
    chunk_indices: torch.Tensor  # [num_chunks, 2] int32: (sequence, chunk within it)
    chunk_offsets: torch.Tensor  # [N + 1] int32: first chunk of each sequence
    bad_offsets: torch.Tensor  # packed: [1] int32, nonzero where cu_seqlens was refused; dense: empty
    is_varlen: bool
    seq_len: int  # dense: T
    chunk: int
    host_offsets: torch.Tensor | None  # once read back: chunk_offsets and token bounds, int64 [2, N + 1]
    split: Segments | None = None  # the state passes' segments where sequences are split

    def segments(self) -> Segments:
        """The state passes' segments: the split where there is one, else one per sequence."""
        if self.split is not None:
            return self.split
        # a dense segment of at least one chunk's tokens: T = 0 leaves every segment empty
        tokens = max(1, cdiv(self.seq_len, self.chunk)) * self.chunk
        return Segments(self.num_sequences, 1, tokens, self.cu_seqlens, self.chunk_offsets, self.cu_seqlens[:0])


@triton.jit(do_not_specialize=["N", "T"])
def _offsets_kernel(cu_seqlens, bad_offsets, bounds, chunk_offsets, N, T, BT: tl.constexpr, BLOCK: tl.constexpr):
    """One program: whether cu_seqlens runs from 0 to T without decreasing, then the offsets the other
    kernels read (those, or where refused sequence 0 over all T tokens and the others empty) and each
    sequence's first chunk. Offsets are compared in 64 bits: an int64 entry past 2^31 is refused, not
    wrapped."""
    o = tl.arange(0, BLOCK)
    wrong = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, N, BLOCK):
        i = start + o
        m = i < N
        lo = tl.load(cu_seqlens + i, mask=m, other=0).to(tl.int64)
        hi = tl.load(cu_seqlens + i + 1, mask=m, other=0).to(tl.int64)
        wrong += (hi < lo).to(tl.int32)
    ends = tl.load(cu_seqlens + tl.where(o == 0, 0, N), mask=o < 2, other=0).to(tl.int64)  # cu[0], cu[N]
    wrong += ((o == 0) & (ends != 0)).to(tl.int32) + ((o == 1) & (ends != T)).to(tl.int32)
    bad = tl.zeros([BLOCK], dtype=tl.int32) + tl.sum(wrong, 0)  # a block: see decode.as_block
    first = 0
    for start in range(0, N, BLOCK):
        i = start + o
        m = i < N
        lo = tl.load(cu_seqlens + i, mask=m, other=0).to(tl.int64)
        hi = tl.load(cu_seqlens + i + 1, mask=m, other=0).to(tl.int64)
        lo = tl.where(bad == 0, lo, tl.where(i == 0, 0, T)).to(tl.int32)
        hi = tl.where(bad == 0, hi, T).to(tl.int32)
        chunks = tl.where(m, (hi - lo + BT - 1) // BT, 0)
        tl.store(bounds + i + 1, hi, mask=m)
        tl.store(chunk_offsets + i + 1, tl.cumsum(chunks, 0) + first, mask=m)
        first += tl.sum(chunks, 0)
    tl.store(bounds + o, bad * 0, mask=o == 0)
    tl.store(chunk_offsets + o, bad * 0, mask=o == 0)
    tl.store(bad_offsets + o, bad, mask=o == 0)


@triton.jit(do_not_specialize=["N", "ROWS", "STEPS"])
def _chunk_rows_kernel(chunk_offsets, chunk_indices, N, ROWS, STEPS, BLOCK: tl.constexpr):
    """Row r of the grid -> (its sequence, its chunk within it): the last sequence whose first chunk is
    at most r, by binary search over chunk_offsets (STEPS halvings cover N). Rows past the last chunk
    fall to the last sequence, past its end."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = lo + (N - 1)
    for _ in range(STEPS):
        mid = (lo + hi + 1) // 2
        up = tl.load(chunk_offsets + mid) <= r  # chunk_offsets[lo] <= r throughout
        lo = tl.where(up, mid, lo)
        hi = tl.where(up, hi, mid - 1)
    m = r < ROWS
    tl.store(chunk_indices + 2 * r, lo, mask=m)
    tl.store(chunk_indices + 2 * r + 1, r - tl.load(chunk_offsets + lo), mask=m)


def _padded(n: int) -> int:
    return cdiv(n, _ALIGN) * _ALIGN


def plan_chunks(
    batch: int, seq_len: int, cu_seqlens: torch.Tensor | None, chunk: int, device: torch.device
) -> ChunkPlan:
    """The plan of a dense batch (batch sequences of seq_len tokens), or of packed sequences (cu_seqlens,
    seq_len tokens in all) with its tables computed on the device: no host copy, no value read."""
    if cu_seqlens is None:
        # an empty tensor allocates nothing and launches nothing (also while a CUDA graph captures)
        empty = torch.empty(0, dtype=torch.int32, device=device)
        chunks = cdiv(seq_len, chunk)
        return ChunkPlan(batch, batch * chunks, chunks, empty, empty, empty, empty, False, seq_len, chunk, None)
    N = cu_seqlens.numel() - 1
    rows = seq_len // chunk + N
    # one buffer: the flag, the offsets, the first chunks and the rows' table, each at 16 bytes
    tables = torch.empty(_ALIGN + 2 * _padded(N + 1) + 2 * rows, dtype=torch.int32, device=cu_seqlens.device)
    bad_offsets = tables[:1]
    bounds = tables[_ALIGN : _ALIGN + N + 1]
    chunk_offsets = tables[_ALIGN + _padded(N + 1) :][: N + 1]
    chunk_indices = tables[_ALIGN + 2 * _padded(N + 1) :].view(rows, 2)
    with device_guard(cu_seqlens):
        launch(_offsets_kernel, (1,))(
            cu_seqlens, bad_offsets, bounds, chunk_offsets, N, seq_len, BT=chunk, BLOCK=TABLE_BLOCK, num_warps=4
        )
        launch(_chunk_rows_kernel, (cdiv(rows, TABLE_BLOCK),))(
            chunk_offsets, chunk_indices, N, rows, max(0, (N - 1).bit_length()), BLOCK=TABLE_BLOCK, num_warps=4
        )
    return ChunkPlan(N, rows, None, bounds, chunk_indices, chunk_offsets, bad_offsets, True, seq_len, chunk, None)


def warm_plan_kernels(device: torch.device) -> None:
    """In a dry run (compile_ahead), the packed plan's kernels for int32 and int64 offsets: a kernel
    class's first call compiles them, whatever its own calls pass."""
    for dtype in (torch.int32, torch.int64):
        plan_chunks(1, 1, torch.zeros(2, dtype=dtype, device=device), 64, device)


def read_back(plan: ChunkPlan) -> ChunkPlan:
    """A packed plan with its offsets on the host (one device-to-host copy): what cutting its sequences
    into segments needs. Refused offsets leave `longest` 0 (never split). In a dry run, where the tables
    are not written, the plan of sequence 0 over every token."""
    N, T = plan.num_sequences, plan.seq_len
    if compiling_only():
        bounds = torch.full((N + 1,), T, dtype=torch.int64)
        bounds[0] = 0
        offsets = torch.full((N + 1,), cdiv(T, plan.chunk), dtype=torch.int64)
        offsets[0] = 0
        bad = False
    else:
        copied = torch.cat([plan.bad_offsets, plan.cu_seqlens, plan.chunk_offsets]).to("cpu", torch.int64)
        bad, bounds, offsets = bool(copied[0]), copied[1 : N + 2], copied[N + 2 :]
    longest = 0 if bad else int((offsets[1:] - offsets[:-1]).max())
    return replace(plan, longest=longest, host_offsets=torch.stack([offsets, bounds]))


def split_sequences(plan: ChunkPlan, chunks_per_segment: int) -> ChunkPlan:
    """The plan with its sequences cut into segments of `chunks_per_segment` chunks (the last of each
    sequence shorter; an empty sequence keeps one empty segment); a packed plan read back first."""
    L = chunks_per_segment
    if not plan.is_varlen:
        per_sequence = max(1, cdiv(plan.longest, L))
        empty = plan.cu_seqlens[:0]
        split = Segments(plan.num_sequences * per_sequence, per_sequence, L * plan.chunk, empty, empty, empty)
        return replace(plan, split=split)
    offsets, bounds = plan.host_offsets
    counts = offsets[1:] - offsets[:-1]
    per_sequence = torch.clamp((counts + L - 1) // L, min=1)
    first = torch.cat([per_sequence.new_zeros(1), per_sequence.cumsum(0)])
    owner = torch.repeat_interleave(torch.arange(plan.num_sequences), per_sequence)
    within = torch.arange(int(first[-1])) - first[owner]
    starts = bounds[owner] + within * L * plan.chunk
    chunk_starts = offsets[owner] + within * L
    device = plan.cu_seqlens.device

    def table(head: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return torch.cat([head, last.reshape(1)]).to(device=device, dtype=torch.int32)

    split = Segments(
        count=int(first[-1]),
        per_sequence=0,
        tokens=0,
        bounds=table(starts, bounds[-1]),
        chunk_offsets=table(chunk_starts, offsets[-1]),
        first=first.to(device=device, dtype=torch.int32),
    )
    return replace(plan, split=split)
