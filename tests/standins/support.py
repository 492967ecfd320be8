"""Shared by the in-process ascendc tests: the stand-in kernels as the raw ops of a route (no registration, so
in-process tests leave torch.ops alone), call counting, and comparison with the eager backend."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from gdn.backends.ascendc.raw import LEGACY, STABLE, RawOps
from gdn.backends.eager import EAGER
from gdn.ops import PREPARE
from reference import rel_err
from standins import kernels_chunk, kernels_conv, kernels_recurrent
from standins.legacy import SCHEMAS

_MODULES = (kernels_chunk, kernels_conv, kernels_recurrent)


def stand_in_ops(*, composite: bool = True, conv_fn: bool = True, **replace: Callable) -> dict[str, Callable]:
    ops = {name: getattr(m, name) for m in _MODULES for name in dir(m) if name.startswith("npu_")}
    if not composite:
        del ops["npu_chunk_gated_delta_rule_fwd"]
    if not conv_fn:
        del ops["npu_causal_conv1d_fn"]
    return ops | replace


def stable(**options: Any) -> RawOps:
    """The 26.10 stable API over the stand-in kernels."""
    return RawOps(STABLE, types.SimpleNamespace(**stand_in_ops(**options)))


def legacy(**replace: Callable) -> RawOps:
    """The legacy torch.ops.npu surface (the 26.6 op set), without touching torch.ops."""
    ops = stand_in_ops(**replace)
    return RawOps(LEGACY, types.SimpleNamespace(**{name: ops[name] for name in SCHEMAS}))


class Counted:
    def __init__(self, fn: Callable):
        self.fn = fn
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.fn(*args, **kwargs)


def run_op(op: str, fn: Callable, inputs: dict[str, Any], grads: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Every output, every pool written and every gradient of one call of `fn` (an implementation
    taking the validated call, as backends do) on fresh copies of `inputs`."""
    args = {k: (v.clone().requires_grad_(k in grads) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    call = PREPARE[op](**args)
    result = fn(*call.args, **call.kwargs)
    outputs = [t for t in (result if isinstance(result, tuple) else (result,)) if t is not None]
    named = {f"out{i}": t.detach() for i, t in enumerate(outputs)}
    named |= {name: args[name].detach() for name in ("conv_states", "ssm_pool") if name in args}
    if grads:
        gen = torch.Generator().manual_seed(1)
        loss = sum((t.float() * torch.randn(t.shape, generator=gen)).sum() for t in outputs)
        computed = torch.autograd.grad(loss, [args[n] for n in grads])
        named |= {f"d{n}": g for n, g in zip(grads, computed, strict=True)}
    return named


def compare_with_eager(op: str, fn: Callable, inputs: dict[str, Any], grads: tuple[str, ...] = ()) -> dict[str, float]:
    ours = run_op(op, fn, inputs, grads)
    ref = run_op(op, EAGER.ops[op], inputs, grads)
    assert set(ours) == set(ref)
    for name, expected in ref.items():
        assert ours[name].shape == expected.shape, name
        assert ours[name].dtype == expected.dtype, name
    return {name: rel_err(ours[name], ref[name]) for name in ref}
