"""Shared by the in-process ascendc tests: the stand-in kernels as the raw ops of a route (no registration, so
in-process tests leave torch.ops alone), call counting, and comparison with the eager backend."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from gdn.backends.ascendc import surface
from gdn.backends.ascendc.contracts import CONTRACTS
from gdn.backends.ascendc.raw import COMPOSITE_FWD, CONV_FN, LEGACY, STABLE, RawOps
from gdn.backends.eager import EAGER
from gdn.calls import PREPARE
from reference import rel_err
from standins import kernels_chunk, kernels_conv, kernels_recurrent
from standins import legacy as legacy_ext
from standins.broken import zeros_for_ones
from standins.conform import conforming

_MODULES = (kernels_chunk, kernels_conv, kernels_recurrent)


def stable_ops(*, composite: bool = True, conv_fn: bool = True) -> dict[str, Callable]:
    """The stable API's ops: each stand-in kernel held to its stable contract."""
    kernels = {name: getattr(m, name) for m in _MODULES for name in dir(m) if name.startswith("npu_")}
    ops = {op: conforming(STABLE, op, kernels[op]) for op in CONTRACTS[STABLE]}
    if not composite:
        del ops[COMPOSITE_FWD]
    if not conv_fn:
        del ops[CONV_FN]
    return ops


def stable(*, composite: bool = True, conv_fn: bool = True, **replace: Callable) -> RawOps:
    """The 26.10 stable API over the stand-in kernels."""
    ops = stable_ops(composite=composite, conv_fn=conv_fn) | replace
    return RawOps(STABLE, types.SimpleNamespace(**ops))


def legacy(**replace: Callable) -> RawOps:
    """The legacy torch.ops.npu surface (the 26.6 op set), without touching torch.ops."""
    return RawOps(LEGACY, types.SimpleNamespace(**(legacy_ext.ops() | replace)))


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
    result = fn(call)
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


def fla_npu(*, stable=True, legacy=True, composite=False, broken_conv=False) -> surface.Surface:
    """An fla_npu as routes.resolve_plan sees it after loading."""
    replace = {"npu_causal_conv1d_fn": zeros_for_ones} if broken_conv else {}
    ops = stable_ops(composite=composite) | replace
    found = surface.Surface(version="26.10.0" if stable else "26.6.0", stand_in="hand-built", has_loader=stable)
    if stable:
        found.stable = types.SimpleNamespace(**ops)
    else:
        found.stable_reason = "fla_npu has no load_legacy_torch_ops(): a 26.6-style wheel"
    if legacy:
        # the legacy extension's conv is a different binding: not broken
        found.legacy_ops = types.SimpleNamespace(**legacy_ext.ops())
        found.legacy_loaded, found.legacy = True, "loaded by load_legacy_torch_ops()"
    else:
        found.legacy = "not shipped: FileNotFoundError: not find custom_aclnn_extension_lib*.so"
    found.generation = surface.generation(stable, stable, legacy)
    return found
