"""Broken conv bindings, for the numeric conv probe to reject. The 26.10 dev wheel's stable conv
returned zeros for all-ones input and large garbage otherwise; each half is here on its own too, so
that each is shown to be caught."""

from __future__ import annotations

import torch

from gdn.backends.ascendc.raw import CONV_FN, STABLE
from standins import kernels_conv
from standins.conform import conforming

_CONV_FN = conforming(STABLE, CONV_FN, kernels_conv.npu_causal_conv1d_fn)


def _ones(x: torch.Tensor) -> bool:
    return bool((x == 1).all())


def zeros_for_ones(x, *args, **kwargs):
    return torch.zeros_like(x) if _ones(x) else _CONV_FN(x, *args, **kwargs)


def garbage_unless_ones(x, *args, **kwargs):
    out = _CONV_FN(x, *args, **kwargs)
    return out if _ones(x) else torch.randn_like(out) * 3.0e4


def dev_wheel(x, *args, **kwargs):
    """Both failures at once, whichever entry (fn or raw) it stands for."""
    return torch.zeros_like(x) if _ones(x) else torch.randn_like(x) * 3.0e4
