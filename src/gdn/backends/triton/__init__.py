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
from gdn.backends.triton._common import INTERPRET_ENV, OpKernel, flavour, is_interpreting

NAME = "triton"
# triton and triton-ascend install the same `triton` module: its version is what imports, else the
# installed distribution's (gdn.matrix.versions)
REGISTRATION = Registration(
    name="triton", backend="TritonBackend", order=20, versions={"triton_flavour": ("triton", "flavour")}
)
INTERPRETER_REASON = f"triton on cpu needs {INTERPRET_ENV}=1 (the interpreter)"
# The device types each Triton target serves (ROCm GPUs are torch device type "cuda").
_TARGETS = {"cuda": ("cuda", "hip"), "npu": ("npu",)}


@dataclass(eq=False)
class TritonBackend(Backend):
    name: str = NAME
    auto_rank: Mapping[str, int] = field(default_factory=lambda: {"cuda": 0, "npu": 1})

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

        # every module of this package may serve ops: its `OPS` declares them, each with what the backend
        # says of it (a new kernel module is picked up with nothing to add here); the sets are known
        # once the table is, which the resolver loads before it reads them
        served: dict[str, OpKernel] = {}
        for module in pkgutil.iter_modules(__path__):
            served.update(getattr(importlib.import_module(f"{__name__}.{module.name}"), "OPS", {}))
        self.forward_only = frozenset(op for op, kernel in served.items() if kernel.forward_only)
        self.guards_values = frozenset(op for op, kernel in served.items() if kernel.guards_values)
        self.probe_tolerance = {op: k.probe_tolerance for op, k in served.items() if k.probe_tolerance is not None}
        return {op: kernel.implementation for op, kernel in served.items()}

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
