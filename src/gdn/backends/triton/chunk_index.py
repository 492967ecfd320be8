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
    """For packed sequences the tables below; for a dense batch they are empty int32 tensors on its
    device, so that the kernels take the same pointer arguments (a runtime flag says which) and a
    dense call and a packed one launch the same binaries."""

    num_sequences: int
    num_chunks: int  # over all sequences; an empty sequence has none
    cu_seqlens: torch.Tensor  # [N + 1] int32
    chunk_indices: torch.Tensor  # [num_chunks, 2] int32: (sequence, chunk within it)
    chunk_offsets: torch.Tensor  # [N + 1] int32: first chunk of each sequence
    is_varlen: bool


def plan_chunks(
    batch: int, seq_len: int, cu_seqlens: torch.Tensor | None, chunk: int, device: torch.device
) -> ChunkPlan:
    if cu_seqlens is None:
        # an empty tensor allocates nothing and launches nothing (also while a CUDA graph captures)
        empty = torch.empty(0, dtype=torch.int32, device=device)
        return ChunkPlan(batch, batch * cdiv(seq_len, chunk), empty, empty, empty, is_varlen=False)
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
        is_varlen=True,
    )
