"""Host-side layout for running many sequences of different lengths as one batch.

Each sequence is cut into blocks of `block` tokens (the last one padded). Blocks are stored
step-major: all first blocks, then all second blocks, and so on, with the sequences sorted by
block count so that the sequences still running at step j are always a prefix. A recurrence over
steps then reads one contiguous slice per step and carries the state of a prefix of sequences,
and total memory stays linear in the number of tokens however uneven the lengths are.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockPlan:
    block: int
    num_tokens: int
    num_slots: int  # num_blocks * block
    token_slot: torch.Tensor  # [num_tokens] slot of each token
    order: torch.Tensor  # [N] sequence at each sorted position
    inverse_order: torch.Tensor  # [N] sorted position of each sequence
    step_offsets: list[int]  # first block of step j; step j spans [step_offsets[j], +active[j])
    active: list[int]  # sequences still running at step j
    identity: bool  # one sequence, no padding: blocks are a view of the tokens

    @property
    def num_steps(self) -> int:
        return len(self.active)

    def to_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """[num_tokens, ...] -> [num_blocks, block, ...], padding slots filled with zeros."""
        if not self.identity:
            slots = x.new_zeros((self.num_slots, *x.shape[1:]))
            x = slots.index_copy(0, self.token_slot, x)
        return x.view(-1, self.block, *x.shape[1:])

    def to_tokens(self, blocks: torch.Tensor) -> torch.Tensor:
        """[num_blocks, block, ...] -> [num_tokens, ...] (the inverse of to_blocks on real tokens)."""
        flat = blocks.reshape(-1, *blocks.shape[2:])
        return flat if self.identity else flat.index_select(0, self.token_slot)


def plan_blocks(lengths: list[int], block: int, device: torch.device) -> BlockPlan:
    return _plan(tuple(lengths), block, device)


@functools.lru_cache(maxsize=64)
def _plan(lengths: tuple[int, ...], block: int, device: torch.device) -> BlockPlan:
    # Training repeats the same lengths step after step: the plan and its device copies are reused.
    lens = torch.tensor(lengths, dtype=torch.int64)
    starts = torch.cumsum(lens, 0) - lens
    num_tokens = int(lens.sum())
    blocks_per_seq = (lens + block - 1) // block
    order = torch.argsort(-blocks_per_seq, stable=True)
    sorted_blocks = blocks_per_seq[order]
    num_steps = int(sorted_blocks[0]) if len(lengths) else 0

    step = torch.arange(num_steps).unsqueeze(1)  # [steps, 1]
    running = sorted_blocks.unsqueeze(0) > step  # [steps, N]
    step_idx, rank = running.nonzero(as_tuple=True)  # row-major: step-major, then sorted rank
    seq = order[rank]
    within = step_idx.unsqueeze(1) * block + torch.arange(block)  # position inside the sequence
    valid = within < lens[seq].unsqueeze(1)
    slot_token = torch.where(valid, starts[seq].unsqueeze(1) + within, num_tokens).flatten()

    token_slot = torch.empty(num_tokens, dtype=torch.int64)
    slots = torch.arange(slot_token.numel())
    real = slot_token < num_tokens
    token_slot[slot_token[real]] = slots[real]

    active = running.sum(1).tolist()
    offsets = [0]
    for count in active[:-1]:
        offsets.append(offsets[-1] + count)
    return BlockPlan(
        block=block,
        num_tokens=num_tokens,
        num_slots=slot_token.numel(),
        token_slot=token_slot.to(device),
        order=order.to(device),
        inverse_order=torch.argsort(order).to(device),
        step_offsets=offsets,
        active=active,
        identity=len(lengths) == 1 and num_tokens % block == 0,
    )


def sequence_lengths(batch: int, seq_len: int, cu_seqlens: torch.Tensor | None) -> list[int]:
    if cu_seqlens is None:
        return [seq_len] * batch
    bounds = cu_seqlens.tolist()
    return [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
