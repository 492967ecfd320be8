"""Where the chunks of a batch lie: the grid of the chunk-parallel kernels and, for packed sequences
(cu_seqlens), the tables that map a program to its sequence.

Chunks are numbered sequence by sequence. The chunk-parallel kernels put that number on grid axis 0,
which has no 65535 limit, so a batch of many short sequences launches like one long sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn.backends.triton._common import cdiv


@dataclass(frozen=True)
class ChunkPlan:
    num_sequences: int
    num_chunks: int  # over all sequences; an empty sequence has none
    cu_seqlens: torch.Tensor | None  # [N + 1] int32
    chunk_indices: torch.Tensor | None  # [num_chunks, 2] int32: (sequence, chunk within it)
    chunk_offsets: torch.Tensor | None  # [N + 1] int32: first chunk of each sequence

    @property
    def is_varlen(self) -> bool:
        return self.cu_seqlens is not None


def plan_chunks(batch: int, seq_len: int, cu_seqlens: torch.Tensor | None, chunk: int) -> ChunkPlan:
    if cu_seqlens is None:
        return ChunkPlan(batch, batch * cdiv(seq_len, chunk), None, None, None)
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
        cu_seqlens=cu_seqlens.to(device=device, dtype=torch.int32).contiguous(),
        chunk_indices=indices.to(device=device, dtype=torch.int32),
        chunk_offsets=offsets.to(device=device, dtype=torch.int32),
    )
