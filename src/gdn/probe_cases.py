"""What the numeric probe (gdn.numeric_probe) runs an op on: its cases, declared with the op (gdn.calls
for the built-in ones, gdn.op_registration for an added one) and kept here by op name, so that the
probe reads them without naming any op."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ProbeClass:
    """The compile-time class of the gated-delta cases: input dtype (None: fp32), heads, head dims,
    l2norm in the kernel, and whether the cases pass an initial state and ask for the final one (where
    they do, one more packed case passes an initial state and does not ask: the call a backend that
    cannot carry the final state's gradient takes), and the initial state's dtype (None: fp32; a kernel
    that keeps its state in bf16 is probed with the call's bf16 state)."""

    dtype: torch.dtype | None = None
    H: int = 2
    HV: int = 4
    K: int = 32
    V: int = 32
    l2norm: bool = True
    initial_state: bool = True
    final_state: bool = True
    state_dtype: torch.dtype | None = None

    def record(self) -> dict[str, Any]:
        state = str(self.state_dtype or torch.float32).removeprefix("torch.") if self.initial_state else None
        return {**asdict(self), "dtype": str(self.dtype or torch.float32).removeprefix("torch."), "state_dtype": state}


@dataclass
class Case:
    """User-level arguments of one op call; `grad` names the inputs whose gradients are compared. A
    `fallback` case runs only where the backend refused every case before it (it would compile
    binaries the asking call does not launch)."""

    name: str
    args: dict[str, Any]
    grad: tuple[str, ...] = ()
    fallback: bool = False


# an op's cases from the probe's generator and the class of the call that asked (the ops other than the
# gated-delta ones ignore the class)
ProbeCases = Callable[[torch.Generator, ProbeClass], Iterable[Case]]
# every op's cases by name: the built-in ops' and those of the ops gdn.op_registration adds
CASES: dict[str, ProbeCases] = {}
