"""What a prepared step relies on of its tensors (type, shape, dtype, device, strides), and a check that
later tensors repeat it.

A decode step compares a handful of tensors with the ones it was prepared for on every token. Read in
Python, that costs each tensor about 0.4 µs of host time (a shape, a device and a strides object built
per tensor). Where this torch offers the guard that torch.compile checks its graphs' tensors with
(`torch._C._dynamo.guards.TensorGuards`: type, dispatch keys, dtype, device, requires_grad, sizes and
strides, compared in C++), `SameMetadata` checks with it outside torch.compile regions; otherwise it
compares `metadata()`."""

from __future__ import annotations

import torch


def metadata(tensors: tuple) -> tuple:
    """What a prepared step relies on of each tensor: type, shape, dtype, device, strides; (type,) for
    anything that is not a tensor."""
    return tuple(
        [
            (type(t), t.shape, t.dtype, t.device, t.stride()) if isinstance(t, torch.Tensor) else (type(t),)
            for t in tensors
        ]
    )


class SameMetadata:
    """`same(*tensors)`: whether `tensors` repeat the metadata of the tensors it was built from. True only
    where they do; with torch's guard it is also False where they differ in what that guard reads
    besides (requires_grad, or dispatch keys such as an inference-mode tensor's), so False alone does
    not say the metadata differ: compare `metadata()` for that. Holds no tensor."""

    __slots__ = ("_guard", "metadata")

    def __init__(self, tensors: tuple) -> None:
        self.metadata = metadata(tensors)
        self._guard = _torch_guard(tensors)

    def __call__(self, *tensors: object) -> bool:
        if len(tensors) != len(self.metadata):
            return False
        # Dynamo cannot trace torch's guard; inside a torch.compile region the comparison in Python
        # becomes the region's own guards
        if self._guard is not None and not torch.compiler.is_compiling():
            return self._guard.check(*tensors)
        return metadata(tensors) == self.metadata


def _torch_guard(tensors: tuple) -> object | None:
    """torch.compile's tensor guard over `tensors` (static sizes and strides), or None where this torch
    has none of that form or an argument is not a tensor."""
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    try:
        from torch._C._dynamo.guards import TensorGuards

        guard = TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )
        usable = guard.check(*tensors)
    except Exception:  # another torch's guard: compare in Python
        return None
    return guard if usable else None
