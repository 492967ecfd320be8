"""Argument checks shared by the stand-in kernels: they refuse what the AscendC ops refuse, so an
adapter that passes the wrong dtype, a device tensor where a host list belongs, or an empty sequence
fails in tests as it would on the NPU."""

from __future__ import annotations

import torch

HALF = (torch.bfloat16, torch.float16)


def half(op: str, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.dtype not in HALF:
            raise TypeError(f"{op}: {name} must be bfloat16 or float16 (AscendC kernel), got {t.dtype}")


def fp32(op: str, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.dtype != torch.float32:
            raise TypeError(f"{op}: {name} must be float32, got {t.dtype}")


def shape(op: str, name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise RuntimeError(f"{op}: {name} must have shape {tuple(expected)}, got {tuple(t.shape)}")


def host_ints(op: str, name: str, value: object) -> list[int] | None:
    """An `int[]` argument: a host list of Python ints, never a tensor."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{op}: {name} must be a host list of ints (int[]), got {type(value).__name__}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError(f"{op}: {name} must hold Python ints, got {[type(v).__name__ for v in value]}")
    return list(value)


def not_modelled(op: str, **flags: object) -> None:
    """Options the stand-in does not compute are refused, never silently ignored."""
    for name, value in flags.items():
        if value not in (None, False):
            raise NotImplementedError(f"{op} stand-in: {name}={value!r} is not modelled")
