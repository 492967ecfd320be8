"""The `flashqla` backend: an adapter for FlashQLA (import package `flash_qla`, distribution flash-qla;
Qwen's fused TileLang GDN prefill kernels), a peer under test and never a requirement.

It serves the chunk op on CUDA GPUs, after `triton` and `fla` in auto, although it is the faster
kernel at most shapes (README): our own kernel needs no per-shape JIT (FlashQLA's first fwd+bwd of a new
shape compiles for tens of seconds to minutes), FlashQLA covers one op in half precision at K = V = 128
only, fla already hands its chunk op to FlashQLA whenever both are installed, and through it the
matrix's mini-GRPO update did not match eager on the H200. Route: "flashqla:<version>".

FlashQLA takes our layout as is (q, k [B, T, H, K], v [B, T, HV, V] with grouped value heads, states
[N, HV, K, V] of any float dtype, varlen through cu_seqlens with B = 1, q/k l2norm in its kernel,
scale). It imports only on SM90, SM100/103 and SM120/121 (its import raises elsewhere, which makes the
backend unavailable with that reason). Sequences without tokens, which FlashQLA refuses, are kept out
of its call (their final state is their initial state); a half-precision g reaches it as fp32, the
dtype its backward requires. A call it cannot take (q/k/v not all bf16 or all fp16, K or V not 128) is
refused per call (`Backend.refusal`): gdn.resolve serves it with the next candidate and counts the
reason in the op's record; under GDN_STRICT=1 the refusal raises GdnBackendError instead.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from gdn import kernel_log
from gdn.backends.base import Backend, OpTable, import_version
from gdn.backends.registry import Registration
from gdn.calls import GdnCall
from gdn.gates import floored

NAME = "flashqla"
REGISTRATION = Registration(name="flashqla", backend="FlashQLABackend", order=40)
OP = "chunk_gated_delta_rule"
HEAD_DIM = 128
DTYPES = (torch.bfloat16, torch.float16)
# The probe feeds bf16 inputs (the only precision FlashQLA takes besides fp16), so its error against
# eager on the same bf16 inputs is bf16 rounding at the kernel's inputs and outputs and between its
# fused stages (fla's Triton path measures 5e-3 on the H200 the same way); a wrong term costs O(1).
PROBE_TOLERANCE = {OP: 2e-2}
# FlashQLA's chunk module: it imports the kernels of this GPU's architecture (a submodule per
# architecture: hopper, blackwell, blackwell_sm120) and decides per forward call, in
# _auto_intra_cp_context, whether to split the sequences across the card (intra-card context parallelism)
CHUNK_MODULE = "flash_qla.ops.gated_delta_rule.chunk"
CP_DECISION = "_auto_intra_cp_context"
LEVEL = "flash_qla"  # the level of FlashQLA's own choice in gdn's kernel log


def refusal(call: GdnCall) -> str | None:
    """Why FlashQLA cannot take this (validated) call, or None."""
    q, k, v, shapes = call.q, call.k, call.v, call.shapes
    if q.dtype not in DTYPES or not q.dtype == k.dtype == v.dtype:
        return f"FlashQLA takes q, k, v all bfloat16 or all float16, got {q.dtype}, {k.dtype}, {v.dtype}"
    if shapes.K != HEAD_DIM or shapes.V != HEAD_DIM:
        return f"FlashQLA takes K = V = {HEAD_DIM} only, got K = {shapes.K}, V = {shapes.V}"
    return None


def _load() -> OpTable:
    import flash_qla

    def run(call: GdnCall, initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor | None):
        return flash_qla.chunk_gated_delta_rule(
            call.q,
            call.k,
            call.v,
            # FlashQLA keeps the gate's cumulative sums in g's dtype and asserts an fp32 dg in its
            # backward; our contract admits a half-precision g, which the cast turns into its gradient.
            # Its chunk kernels take differences of those sums: a -inf gate is floored (gdn.gates).
            floored(call.g.float()),
            call.beta,
            scale=call.scale,
            initial_state=initial_state,
            output_final_state=call.output_final_state,
            use_qk_l2norm_in_kernel=call.use_qk_l2norm_in_kernel,
            cu_seqlens=cu_seqlens,
        )

    def chunk_gated_delta_rule(call: GdnCall):
        if call.cu_seqlens is None:
            return run(call, call.initial_state, None)
        # FlashQLA declares LongTensor (our contract also admits int32) and refuses a sequence without
        # tokens ("invalid sequence lengths"), which our contract admits: such a sequence has no output
        # rows and its final state is its initial state, so it is left out of FlashQLA's call and its
        # state put back after. FlashQLA reads the offsets on the host anyway (its context-parallel
        # plan), so reading them here adds no synchronisation.
        bounds = call.cu_seqlens.tolist()
        kept = [n for n in range(len(bounds) - 1) if bounds[n + 1] > bounds[n]]
        if len(kept) == len(bounds) - 1:
            return run(call, call.initial_state, call.cu_seqlens.long())
        return _around_empty_sequences(call, bounds, kept, run)

    return {OP: chunk_gated_delta_rule}


def _around_empty_sequences(call: GdnCall, bounds: list[int], kept: list[int], run):
    shapes, device = call.shapes, call.v.device
    if call.initial_state is not None:
        states = call.initial_state.float()
    else:
        states = torch.zeros(shapes.N, shapes.HV, shapes.K, shapes.V, dtype=torch.float32, device=device)
    rows = torch.tensor(kept, device=device)
    offsets = torch.tensor([bounds[0], *(bounds[n + 1] for n in kept)], dtype=torch.long, device=device)
    initial = None if call.initial_state is None else call.initial_state.index_select(0, rows)
    o, final = run(call, initial, offsets)
    return o, (states.index_copy(0, rows, final) if call.output_final_state else None)


@contextlib.contextmanager
def watching() -> Iterator[bool]:
    """While the block runs, each forward call of FlashQLA's chunk op, whoever makes it (this adapter, or
    fla handing its chunk op to FlashQLA), notes the variant it ran in gdn's kernel log: the kernels'
    architecture and whether the call was split across the card ("hopper, intra-card CP"). Yields
    whether FlashQLA's chunk module was found (it imports only on the GPUs it supports)."""
    try:
        chunk = importlib.import_module(CHUNK_MODULE)
        decide = getattr(chunk, CP_DECISION)
        # flash_qla.ops.gated_delta_rule.chunk.hopper.fused_fwd -> hopper
        architecture = chunk.fused_gdr_fwd.__module__.removeprefix(f"{CHUNK_MODULE}.").split(".")[0]
    except Exception:  # not installed, or not importable on this machine
        decide = None
    if decide is None or getattr(decide, kernel_log.ORIGINAL, None) is not None:  # absent, or watched already
        yield decide is not None
        return

    def noted(k: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        context = decide(k, *args, **kwargs)
        split = ", intra-card CP" if getattr(context, "is_intra", False) else ""
        kernel_log.note(LEVEL, OP, k.dtype, f"{architecture}{split}")
        return context

    setattr(noted, kernel_log.ORIGINAL, decide)
    setattr(chunk, CP_DECISION, noted)
    try:
        yield True
    finally:
        setattr(chunk, CP_DECISION, decide)


@dataclass(eq=False)
class FlashQLABackend(Backend):
    name: str = NAME
    devices: tuple[str, ...] = ("cuda",)
    auto_rank: Mapping[str, int] = field(default_factory=lambda: {"cuda": 2})
    probe_tolerance: Mapping[str, float] = field(default_factory=lambda: PROBE_TOLERANCE)
    probe_dtype: Any = torch.bfloat16
    probe_head_dims: tuple[int, int] | None = (HEAD_DIM, HEAD_DIM)
    probe_outside_limits: tuple[int, int] | None = (HEAD_DIM // 2, HEAD_DIM // 2)
    trusts_values: frozenset[str] = frozenset({OP})  # its kernels read cu_seqlens on the device unchecked
    peer: bool = True

    def loader(self) -> OpTable:
        return _load()

    def route(self, op: str) -> str:
        return f"{NAME}:{import_version('flash_qla')}"

    def watch(self) -> AbstractContextManager[bool]:
        return watching()

    def refusal(self, op: str, call: GdnCall) -> str | None:
        return refusal(call)

    def why_op_unavailable(self, op: str) -> str | None:
        return f"FlashQLA has chunked prefill kernels only (no {op})"
