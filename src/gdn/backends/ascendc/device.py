"""Where the ascendc backend runs: the current NPU, through torch_npu.

Tests have no NPU. The stand-in torch_npu under tests/standins declares
`__gdn_stand_in_device__ = "cpu"`, and then, and only then, the backend serves cpu tensors in its
place; the stand-in label travels into every record the backend makes. No environment variable or
argument can make a real installation treat cpu as an NPU.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from gdn.backends.ascendc.surface import STAND_IN_ATTR
from gdn.backends.base import describe_error

STAND_IN_DEVICE_ATTR = "__gdn_stand_in_device__"


@dataclass(frozen=True)
class Npu:
    device: torch.device | None  # where the kernels run; None when torch_npu does not import
    error: str | None = None
    stand_in: str | None = None  # the stand-in torch_npu's label

    def record(self) -> dict[str, str | None]:
        device = None if self.device is None else str(self.device)
        return {"device": device, "error": self.error, "stand_in": self.stand_in}


def locate() -> Npu:
    try:
        torch_npu = importlib.import_module("torch_npu")
    except Exception as exc:  # e.g. ImportError: libhccl.so ... when CANN is missing
        return Npu(None, f"torch_npu is not importable: {describe_error(exc)}")
    stand_in_device = getattr(torch_npu, STAND_IN_DEVICE_ATTR, None)
    if stand_in_device is not None:
        return Npu(torch.device(stand_in_device), stand_in=getattr(torch_npu, STAND_IN_ATTR, "torch_npu stand-in"))
    try:
        return Npu(torch.device("npu", torch.npu.current_device()))
    except Exception as exc:  # torch_npu imports but no device answers
        return Npu(None, f"no NPU available: {describe_error(exc)}")


def why_not(device_type: str, npu: Npu) -> str | None:
    if npu.device is None:
        return npu.error
    if device_type == npu.device.type:
        return None
    if device_type == "cpu":
        return "serves cpu only through the stand-in torch_npu of tests/standins; this torch_npu is real"
    return f"runs on {npu.device.type}, not {device_type}"
