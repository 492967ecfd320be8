"""The `triton` backend: the project's own Triton kernels (route "triton:bundled").

It serves CUDA GPUs (auto picks it first there), Ascend NPUs through triton-ascend (second in auto,
after the AscendC kernels) and the host only under the Triton interpreter (TRITON_INTERPRET=1, for
CI; never picked by auto). Triton and the kernel modules are imported on first resolution, so a
missing or broken Triton is a rejection reason, not an import error of gdn.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gdn.backends.base import Backend, OpTable, describe_error
from gdn.backends.registry import Registration
from gdn.backends.triton._common import INTERPRET_ENV, flavour, is_interpreting

NAME = "triton"
# triton and triton-ascend install the same `triton` module: its version is what imports, else the
# installed distribution's (gdn.matrix.versions)
REGISTRATION = Registration(
    name="triton", backend="TritonBackend", order=20, versions={"triton_flavour": ("triton", "flavour")}
)
INTERPRETER_REASON = f"triton on cpu needs {INTERPRET_ENV}=1 (the interpreter)"
# The device types each Triton target serves (ROCm GPUs are torch device type "cuda").
_TARGETS = {"cuda": ("cuda", "hip"), "npu": ("npu",)}

# The numeric probe runs fp32 inputs, compared with eager's fp32. l2norm has no matmul: a few fp32
# ulps apart (the GPU rsqrt is approximate to about 2^-22). The chunk kernels take fp32 inputs with
# IEEE fp32 products (no TF32; common/tiles.py `mma`), so they are held to the fp32 bar:
# summation order leaves them about 1e-6 apart, and a wrong term costs far more than 1e-4.
# The inference kernels have no matmul either: a few ulps, like l2norm.
PROBE_TOLERANCE = {
    "l2norm": 1e-5,
    "chunk_gated_delta_rule": 1e-4,
    "fused_recurrent_gated_delta_rule": 1e-5,
    "fused_recurrent_gated_delta_rule_update": 1e-5,
    "causal_conv1d_fn": 1e-5,
    "causal_conv1d_update": 1e-5,
    "fused_gdn_gating": 1e-5,
}
# The serving kernels have no backward: calls that need gradients run eager (gdn.resolve.Resolution.serve).
FORWARD_ONLY = frozenset(
    {
        "fused_recurrent_gated_delta_rule",
        "fused_recurrent_gated_delta_rule_update",
        "causal_conv1d_fn",
        "causal_conv1d_update",
        "fused_gdn_gating",
    }
)

# The decode and conv kernels check the pool slots and offsets on the device (decode.py, conv.py), and the
# chunk op its cu_seqlens while it plans a packed batch on the device (chunk_index.py), so that a serving
# step or a packed prefill never reads them on the host.
GUARDS_VALUES = frozenset(
    {
        "chunk_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        "fused_recurrent_gated_delta_rule_update",
        "causal_conv1d_fn",
        "causal_conv1d_update",
    }
)


@dataclass(eq=False)
class TritonBackend(Backend):
    name: str = NAME
    auto_rank: Mapping[str, int] = field(default_factory=lambda: {"cuda": 0, "npu": 1})
    probe_tolerance: Mapping[str, float] = field(default_factory=lambda: PROBE_TOLERANCE)
    forward_only: frozenset[str] = FORWARD_ONLY
    guards_values: frozenset[str] = GUARDS_VALUES

    def check(self, device_type: str) -> str | None:
        if is_interpreting():
            return None
        if device_type == "cpu":
            return INTERPRETER_REASON
        try:
            info = flavour()
        except Exception as exc:  # no triton, or no usable driver: the reason, not a crash
            return describe_error(exc)
        if info.target not in _TARGETS[device_type]:
            return f"{info.describe()} does not target {device_type}"
        return None

    def loader(self) -> OpTable:
        import triton  # noqa: F401 - its ImportError is the reason the backend is unavailable

        # every module of this package may serve ops: its `OPS` names them (a new kernel module is
        # picked up with nothing to add here)
        table: OpTable = {}
        for module in pkgutil.iter_modules(__path__):
            table.update(getattr(importlib.import_module(f"{__name__}.{module.name}"), "OPS", {}))
        return table

    def compile_ahead(self, op: str, calls: list, meanwhile: Callable[[], object]) -> None:
        if op == "chunk_gated_delta_rule":  # the one op of many kernels, each compiled per kernel class
            from gdn.backends.triton.chunk import compile_calls_ahead

            compile_calls_ahead(calls, meanwhile)
        else:
            meanwhile()

    def route(self, op: str) -> str:
        return "triton:bundled(interpreter)" if is_interpreting() else "triton:bundled"

    def describe(self) -> dict[str, Callable[[], Any]]:
        from gdn.backends.triton.findings import triton_section

        return {"triton": triton_section}
