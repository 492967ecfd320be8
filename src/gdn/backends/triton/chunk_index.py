"""Where the chunks of a batch lie: the grid of the chunk-parallel kernels and, for packed sequences
(cu_seqlens), the tables that map a program to its sequence; and how the state passes split the
sequences into segments.

Chunks are numbered sequence by sequence. The chunk-parallel kernels put that number on grid axis 0,
which has no 65535 limit, so a batch of many short sequences launches like one long sequence."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from gdn.backends.triton._common import cdiv


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
    num_chunks: int  # over all sequences; an empty sequence has none
    longest: int  # chunks of the longest sequence
    cu_seqlens: torch.Tensor  # [N + 1] int32
    chunk_indices: torch.Tensor  # [num_chunks, 2] int32: (sequence, chunk within it)
    chunk_offsets: torch.Tensor  # [N + 1] int32: first chunk of each sequence
    is_varlen: bool
    seq_len: int  # dense: T
    chunk: int
    host_offsets: torch.Tensor | None  # packed: chunk_offsets and token bounds on the host, int64 [2, N + 1]
    split: Segments | None = None  # the state passes' segments where sequences are split

    def segments(self) -> Segments:
        """The state passes' segments: the split where there is one, else one per sequence."""
        if self.split is not None:
            return self.split
        # a dense segment of at least one chunk's tokens: T = 0 leaves every segment empty
        tokens = max(1, cdiv(self.seq_len, self.chunk)) * self.chunk
        return Segments(self.num_sequences, 1, tokens, self.cu_seqlens, self.chunk_offsets, self.cu_seqlens[:0])


def plan_chunks(
    batch: int, seq_len: int, cu_seqlens: torch.Tensor | None, chunk: int, device: torch.device
) -> ChunkPlan:
    if cu_seqlens is None:
        # an empty tensor allocates nothing and launches nothing (also while a CUDA graph captures)
        empty = torch.empty(0, dtype=torch.int32, device=device)
        chunks = cdiv(seq_len, chunk)
        return ChunkPlan(batch, batch * chunks, chunks, empty, empty, empty, False, seq_len, chunk, None)
    device = cu_seqlens.device
    # One host copy: the launch grid needs the chunk count on the host anyway.
    bounds = cu_seqlens.to("cpu", torch.int64)
    counts = (bounds[1:] - bounds[:-1] + chunk - 1) // chunk
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    total = int(offsets[-1])
    sequence = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    within = torch.arange(total) - offsets[sequence]
    indices = torch.stack([sequence, within], dim=1)
    return ChunkPlan(
        num_sequences=counts.numel(),
        num_chunks=total,
        longest=int(counts.max()) if counts.numel() else 0,
        cu_seqlens=cu_seqlens.to(device=device, dtype=torch.int32).contiguous(),
        chunk_indices=indices.to(device=device, dtype=torch.int32),
        chunk_offsets=offsets.to(device=device, dtype=torch.int32),
        is_varlen=True,
        seq_len=int(bounds[-1]),
        chunk=chunk,
        host_offsets=torch.stack([offsets, bounds]),
    )


def split_sequences(plan: ChunkPlan, chunks_per_segment: int) -> ChunkPlan:
    """The plan with its sequences cut into segments of `chunks_per_segment` chunks (the last of each
    sequence shorter; an empty sequence keeps one empty segment)."""
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
