"""The `ascendc` Backend object: fla_npu's AscendC kernels on Ascend NPUs, first in auto there.

Its routes are resolved once per process (routes.py). Asked for an op whose route decision violates
GDN_STRICT=1 (a route rejected by its numeric probe, GDN_NPU_FUSED_FWD=1 without the composite op),
it raises GdnBackendError, in auto mode too: a kernel that is finite but wrong is never silently
skipped when the user asked not to degrade. Other ops are served as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gdn.backends.ascendc import device as npu_device
from gdn.backends.ascendc import findings, routes
from gdn.backends.base import Backend, OpTable
from gdn.backends.registry import Registration
from gdn.calls import Call
from gdn.errors import STRICT_ENV, GdnBackendError, strict

NAME = "ascendc"
REGISTRATION = Registration(
    name="ascendc",
    backend="AscendcBackend",
    order=10,
    versions={
        "fla_npu": ("fla_npu", "distribution", "version"),
        "fla_npu_generation": ("fla_npu", "api", "generation"),
    },
)

# The generic numeric probe feeds fp32 inputs, which these kernels take in bf16: its errors are those
# of bf16 rounding at the kernels' inputs and between the chained ops (measured with the stand-ins:
# ~3e-3 outputs, up to ~6e-3 gradients, see tests/backends/ascendc/test_ascendc_adapters.py); a wrong term costs O(1).
PROBE_TOLERANCE = {
    "chunk_gated_delta_rule": 2e-2,
    "fused_recurrent_gated_delta_rule": 2e-2,
    "fused_recurrent_gated_delta_rule_update": 2e-2,
    "causal_conv1d_fn": 2e-2,
}


@dataclass(eq=False)
class AscendcBackend(Backend):
    """Adds what the resolver cannot ask a plain Backend: why one op has no route, which calls its
    route refuses (limits of the fla_npu ops, gradients they cannot give), and the inputs its numeric
    probe should use (the kernels take bf16; the chunk ops need K = 128)."""

    name: str = NAME
    devices: tuple[str, ...] = ("npu", "cpu")  # cpu only under the stand-in torch_npu (device.py)
    auto_rank: Mapping[str, int] = field(default_factory=lambda: {"npu": 0})
    probe_tolerance: Mapping[str, float] = field(default_factory=lambda: PROBE_TOLERANCE)
    # npu_recurrent_gated_delta_rule has no backward: calls that need gradients run eager
    forward_only: frozenset[str] = frozenset(routes.RECURRENT_OPS)
    # the kernels take cu_seqlens as host lists unchecked; the pooled ops (the conv's varlen form, the
    # pool decode) read slots and offsets on the host and serve a bad row NaN (gdn.pool_rows)
    trusts_values: frozenset[str] = frozenset({routes.CHUNK_OP, "fused_recurrent_gated_delta_rule"})
    probe_dtype: torch.dtype = torch.bfloat16
    probe_head_dims: tuple[int, int] = (128, 128)
    # the decomposed chain wants K = 128 (and the recurrent op K = V = 128 on later builds): a probe
    # case at 64 shows each op's refusal on record, or that its kernel takes that shape
    probe_outside_limits: tuple[int, int] = (64, 64)

    def check(self, device_type: str) -> str | None:
        return npu_device.why_not(device_type, npu_device.locate()) or routes.plan().unavailable

    def loader(self) -> OpTable:
        return {op: entry.fn for op, entry in routes.plan().ops.items() if entry.fn is not None}

    def route(self, op: str) -> str:
        return routes.plan().ops[op].route or NAME

    def why_op_unavailable(self, op: str) -> str | None:
        entry = routes.plan().ops.get(op)
        return None if entry is None else entry.reason

    def refusal(self, op: str, call: Call) -> str | None:
        entry = routes.plan().ops.get(op)
        return None if entry is None or entry.refusal is None else entry.refusal(call)

    def implementation(self, op: str) -> Callable | None:
        entry = routes.plan().ops.get(op)
        if entry is not None and entry.strict_error and strict():
            raise GdnBackendError(
                f"gdn: {op}: backend '{NAME}': {entry.strict_error}, and {STRICT_ENV}=1 forbids falling back"
            )
        return super().implementation(op)

    def describe(self) -> dict[str, Callable[[], Any]]:
        # fla_npu first: the routes load what fla_npu offers (its legacy extension, for one)
        return {"fla_npu": findings.fla_npu_section, "ascendc": findings.ascendc_section}
