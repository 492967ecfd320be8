"""A peer backend of one file, as a new peer would be written: its class and its REGISTRATION, and
nothing else anywhere names it. tests/backends/test_backend_registry.py drops a copy of this module into the
gdn.backends package (a directory under tmp_path on the package's path) and finds it resolved, named by
matrix.yaml's validation, versioned, probed and benchmarked."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gdn.backends.base import Backend, OpTable
from gdn.backends.registry import Registration
from gdn.calls import L2NormCall

TOY_VERSION = "0.7.1"
REGISTRATION = Registration(
    name="toy", backend="ToyBackend", order=60, versions={"toy": ("toy", "distribution", "version")}
)


def toy_l2norm(call: L2NormCall) -> torch.Tensor:
    x = call.x.double()
    return (x / torch.sqrt((x * x).sum(-1, keepdim=True) + call.eps)).to(call.x.dtype)


@dataclass(eq=False)
class ToyBackend(Backend):
    """A peer of one op on the host, first in auto there."""

    name: str = "toy"
    devices: tuple[str, ...] = ("cpu",)
    auto_rank: Mapping[str, int] = field(default_factory=lambda: {"cpu": 0})
    probe_tolerance: Mapping[str, float] = field(default_factory=lambda: {"l2norm": 1e-5})
    peer: bool = True

    def loader(self) -> OpTable:
        return {"l2norm": toy_l2norm}

    def route(self, op: str) -> str:
        return f"toy:{TOY_VERSION}"

    def describe(self) -> dict[str, Callable[[], Any]]:
        return {"toy": lambda: {"distribution": {"name": "toy-kernels", "version": TOY_VERSION}}}
