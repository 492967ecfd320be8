"""The startup conv probe: run a route's causal_conv1d_fn adapter forward and backward against an
autograd F.conv1d reference and reject it past a relative-error threshold.

A finite-but-wrong conv surfaces as a NaN loss hours into training; the fla_npu 26.10 dev wheel's
stable conv returned zeros for all-ones input and large garbage otherwise, and an isfinite check let
it through. The cases: all ones (the zeros-for-ones failure), random dense with initial states
(forward and every gradient), and random varlen against a conv-state pool (the metadata path).
Inputs are bf16, what the kernel takes; the reference convolves the same values in fp32.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from gdn.backends.base import describe_error
from gdn.calls import ConvCall

THRESHOLD = 0.15  # relative error, forward and backward (xtuner's bf16 threshold)
D, W = 64, 4


def _reference(x, weight, bias, history) -> torch.Tensor:
    """x [B, D, T], history [B, D, W - 1] -> silu(conv) in fp32."""
    extended = torch.cat([history, x], dim=-1)
    return F.silu(F.conv1d(extended, weight.unsqueeze(1), bias, groups=weight.shape[0]))


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


def _dense_case(fn: Callable, x, weight, bias, history, gen: torch.Generator) -> dict[str, tuple]:
    ours = _leaves(x, weight, bias, history)
    out = fn(ConvCall(*ours[:3], "silu", initial_states=ours[3]))
    ref = _leaves(*(t.float() for t in (x, weight, bias, history)))
    expected = _reference(ref[0], ref[1], ref[2], ref[3])
    upstream = torch.randn(expected.shape, generator=gen).to(expected.device)
    grads = torch.autograd.grad((out.float() * upstream).sum(), ours)
    ref_grads = torch.autograd.grad((expected * upstream).sum(), ref)
    pairs = {"out": (out, expected)}
    for name, got, want in zip(("dx", "dweight", "dbias", "dinitial"), grads, ref_grads, strict=True):
        pairs[name] = (got, want)
    return pairs


def _varlen_case(fn: Callable, x, weight, bias, pool) -> dict[str, tuple]:
    """Two sequences packed in x [D, 40]: the first reads pool row 1, the second starts from zeros."""
    bounds = [0, 24, 40]
    device = x.device
    states = pool.clone()
    out = fn(
        ConvCall(
            x,
            weight,
            bias,
            "silu",
            query_start_loc=torch.tensor(bounds, dtype=torch.int32, device=device),
            conv_states=states,
            cache_indices=torch.tensor([1, 0], dtype=torch.int32, device=device),
            has_initial_state=torch.tensor([True, False], device=device),
        )
    )
    histories = [pool[1].float(), torch.zeros_like(pool[0], dtype=torch.float32)]
    spans = list(itertools.pairwise(bounds))
    expected = torch.cat(
        [
            _reference(x[:, a:b].float()[None], weight.float(), bias.float(), h[None])[0]
            for (a, b), h in zip(spans, histories, strict=True)
        ],
        dim=-1,
    )
    finals = torch.stack(
        [torch.cat([h, x[:, a:b].float()], -1)[:, -(W - 1) :] for (a, b), h in zip(spans, histories, strict=True)]
    )
    return {"out": (out, expected), "conv_states": (states[[1, 0]], finals)}


def _judge(label: str, got: torch.Tensor, want: torch.Tensor, errors: dict[str, float]) -> str | None:
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape:
        return f"{label}: shape {list(got.shape)}, expected {list(want.shape)}"
    if not torch.isfinite(got).all():
        return f"{label}: contains NaN or Inf"
    if want.abs().amax() > 0 and got.abs().amax() == 0:
        return f"{label}: all zeros where the reference is not"
    err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    errors[label] = err
    return f"{label}: rel err {err:.3g} > {THRESHOLD}" if err > THRESHOLD else None


def probe_conv(fn: Callable, device: torch.device) -> dict[str, Any]:
    """Run the adapter `fn` (our causal_conv1d_fn contract); a record with passed / reason / errors."""
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    errors: dict[str, float] = {}
    record: dict[str, Any] = {"passed": True, "reason": None, "seed": seed, "threshold": THRESHOLD, "rel_err": errors}

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device, torch.bfloat16)

    def ones(*shape: int) -> torch.Tensor:
        return torch.ones(*shape, dtype=torch.bfloat16, device=device)

    cases = {
        "ones": lambda: _dense_case(fn, ones(2, D, 40), ones(D, W), ones(D), ones(2, D, W - 1), gen),
        "dense": lambda: _dense_case(fn, rand(2, D, 40), rand(D, W, scale=0.5), rand(D), rand(2, D, W - 1), gen),
        "varlen": lambda: _varlen_case(fn, rand(D, 40), rand(D, W, scale=0.5), rand(D), rand(2, D, W - 1)),
    }
    for case, run in cases.items():
        try:
            pairs = run()
        except Exception as exc:  # a kernel that raises is rejected with its own message
            record.update(passed=False, reason=f"{case}: raised {describe_error(exc)}")
            return record
        for name, (got, want) in pairs.items():
            reason = _judge(f"{case}.{name}", got, want, errors)
            if reason:
                record.update(passed=False, reason=reason)
                return record
    return record
