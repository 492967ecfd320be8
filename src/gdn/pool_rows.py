"""Which rows of a pooled call (the pool decode, the conv's update and its varlen prefill) an
implementation that reads the slot indices and offsets on the host serves, for a call that reaches it
without the host checks (GDN_VALUE_CHECKS=0): the answer the triton kernels give on the device, so
that no check mode lets a bad index reach memory outside the pool.

Index -1 skips a row (zero outputs, or no history; no write). A slot out of [-1, slots), or a live
slot that two rows name (both would write it), refuses the row: its outputs are NaN and its slot is
neither read nor written. Offsets that the host check refuses (not 0 first, not the token count last,
or decreasing: sequences would overlap) refuse every row."""

from __future__ import annotations

from dataclasses import dataclass

from gdn._validate import first_offset_fault, slot_faults


@dataclass(frozen=True)
class PoolRows:
    kept: list[int]  # each row's slot where the row is served, else -1 (read and written as a skipped row)
    refused: list[int]  # the rows whose outputs are NaN

    @property
    def served(self) -> list[int]:
        return [row for row, slot in enumerate(self.kept) if slot >= 0]


def offsets_in_order(offsets: list[int], tokens: int) -> bool:
    return first_offset_fault("offsets", offsets, tokens) is None


def pool_rows(slots: list[int], pool_slots: int) -> PoolRows:
    """The rows of a call with the slot indices `slots` (one per row) into a pool of `pool_slots`;
    a call whose offsets are not in order (offsets_in_order) serves no row."""
    faults = slot_faults(slots, pool_slots)
    refused = {fault.row for fault in faults} | {fault.earlier for fault in faults if fault.earlier is not None}
    kept = [-1 if row in refused else slot for row, slot in enumerate(slots)]
    return PoolRows(kept, sorted(refused))
