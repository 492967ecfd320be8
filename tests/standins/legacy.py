"""The stand-in legacy extension: fla_npu's ops registered as torch.ops.npu.* with the dispatcher
schemas of their legacy contracts (fla_npu 26.6's npu_custom.yaml, in gdn.backends.ascendc.contracts),
so that calls are checked the way the real dispatcher checks them (argument names, keyword-only
arguments, int[] host lists, optional tensors), and the rest of each contract by standins.conform.

Dispatcher ops return tensors where the Python ops return None (an undefined tensor comes back as
None from C++, never from a Python kernel), so empty tensors stand in for them here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gdn.backends.ascendc.contracts import CONTRACTS
from gdn.backends.ascendc.raw import LEGACY
from standins import kernels_chunk, kernels_conv
from standins.conform import conforming

SCHEMAS = {op: c.schema for op, c in CONTRACTS[LEGACY].items()}


def ops() -> dict[str, Callable]:
    """The legacy ops as Python functions over the stand-in kernels (no registration)."""
    return {
        op: conforming(LEGACY, op, getattr(m, op))
        for m in (kernels_chunk, kernels_conv)
        for op in SCHEMAS
        if hasattr(m, op)
    }


def _defined(op: Callable) -> Callable:
    def call(*args, **kwargs):
        out = op(*args, **kwargs)
        if not isinstance(out, tuple):
            return out
        return tuple(torch.empty(0) if t is None else t for t in out)

    return call


_library: torch.library.Library | None = None  # the registrations live as long as this object


def register() -> None:
    global _library
    if _library is not None:
        return
    library = torch.library.Library("npu", "FRAGMENT")
    for name, op in ops().items():
        library.define(SCHEMAS[name])
        library.impl(name, _defined(op), "CompositeExplicitAutograd")
    _library = library
