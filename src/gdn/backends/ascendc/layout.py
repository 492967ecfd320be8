"""The AscendC ops' host-side sequence conventions, kept inside the adapters.

The ops take cu_seqlens and chunk indices as host int lists (chunk indices flattened as
[sequence, chunk, sequence, chunk, ...]) and their tiling rejects zero-length sequences, which our
contract allows: empty sequences are dropped from what the kernels see, and the adapters give them
their state back unchanged.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch

CHUNK = 64


@dataclass(frozen=True)
class Sequences:
    rows: int  # B
    length: int  # T, tokens per row
    lengths: tuple[int, ...]  # every sequence of the call, in order
    varlen: bool

    @functools.cached_property
    def kept(self) -> tuple[int, ...]:
        return tuple(n for n, size in enumerate(self.lengths) if size > 0)

    @property
    def drops_any(self) -> bool:
        return len(self.kept) != len(self.lengths)

    @functools.cached_property
    def cu_seqlens(self) -> list[int] | None:
        if not self.varlen:
            return None
        bounds = [0]
        for n in self.kept:
            bounds.append(bounds[-1] + self.lengths[n])
        return bounds

    @functools.cached_property
    def chunk_indices(self) -> list[int] | None:
        if not self.varlen:
            return None
        sizes = [self.lengths[n] for n in self.kept]
        return [v for seq, size in enumerate(sizes) for chunk in range(-(-size // CHUNK)) for v in (seq, chunk)]

    def host_lists(self) -> dict[str, list[int] | None]:
        return {"cu_seqlens": self.cu_seqlens, "chunk_indices": self.chunk_indices}

    def first_chunks(self) -> list[tuple[int, int, int, int]]:
        """(row, position on h's chunk axis, first token, tokens) of each kept sequence's first chunk."""
        if not self.varlen:
            return [(row, 0, 0, min(CHUNK, self.length)) for row in range(self.rows)]
        firsts, index, start = [], 0, 0
        for n in self.kept:
            size = self.lengths[n]
            firsts.append((0, index, start, min(CHUNK, size)))
            index, start = index + -(-size // CHUNK), start + size
        return firsts

    def kept_index(self, device: torch.device) -> torch.Tensor:
        return torch.tensor(self.kept, dtype=torch.long, device=device)

    def chunk_slots(self, device: torch.device) -> tuple[torch.Tensor, int]:
        """Slot chunk * CHUNK + position of every token (rows flattened), and the chunk count: the
        chunks the ops cut, for the torch helpers that work chunk by chunk."""
        sizes = tuple(self.lengths[n] for n in self.kept)
        return _chunk_slots(sizes, device)


@functools.lru_cache(maxsize=64)
def _chunk_slots(sizes: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, int]:
    # Training repeats the same lengths layer after layer: the slots are built once per shape.
    lens = torch.tensor(sizes, dtype=torch.long)
    chunks = (lens + CHUNK - 1) // CHUNK
    first_chunk = torch.cumsum(chunks, 0) - chunks
    starts = torch.cumsum(lens, 0) - lens
    seq = torch.repeat_interleave(torch.arange(len(sizes)), lens)
    pos = torch.arange(int(lens.sum())) - starts[seq]
    slots = (first_chunk[seq] + pos // CHUNK) * CHUNK + pos % CHUNK
    return slots.to(device), int(chunks.sum())


def sequences(rows: int, length: int, cu_seqlens: torch.Tensor | None) -> Sequences:
    if cu_seqlens is None:
        return Sequences(rows, length, (length,) * rows, varlen=False)
    bounds = cu_seqlens.tolist()  # the one device-to-host copy the host-list ops force
    return Sequences(rows, length, tuple(b - a for a, b in itertools.pairwise(bounds)), varlen=True)
