"""Comparing two GRPO runs, with tolerances derived from what served the GDN ops.

Floors (fp32 throughout, TF32 off): gdn's eager backend against transformers' own torch code, the
same math in a different order, differs by ~5e-7 in log-probs and entropies, ~5e-6 in the gradient
norm and the whole update, and up to ~4e-5 in the update of a single tensor (a tensor's gradient is a
sum over tokens with cancellation). The floors sit 20-50x above that. A backend that passed its numeric
probe at tolerance tau (relative error of each op output and input gradient against eager) may move
every forward and global gradient quantity by about tau and a single tensor's update by about 10 tau
(that cancellation, ~6x measured). Defects are far above: the GDN layers move the logits by more than
their own size, and a gate off by only 5% moves the log-probs by 3e-3 and the update by 5e-2 (see
test_comparison_rejects_a_backend_with_a_small_gate_error)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import gdn.resolve
from gdn.numeric_probe import DEFAULT_TOLERANCE
from grpo.run import Run
from reference import rel_err

FORWARD_FLOOR = 1e-5
GRADIENT_FLOOR = 1e-4
TENSOR_FLOOR = 1e-3
TENSOR_FACTOR = 10
# A tensor whose update is under 1% of the whole update is held to 1% of the whole update: below that
# its relative error is cancellation noise, not a defect of the backend.
SMALL_TENSOR = 1e-2


@dataclass(frozen=True)
class Tolerance:
    forward: float
    gradient: float
    tensor: float

    @classmethod
    def for_backends(cls, served: dict[str, str]) -> Tolerance:
        """`served`: op -> the backend that served it in the run under test."""
        registry = gdn.resolve.backends()
        tau = max(
            (registry[b].probe_tolerance.get(op, DEFAULT_TOLERANCE) for op, b in served.items() if b != "eager"),
            default=0.0,
        )
        return cls(max(FORWARD_FLOOR, tau), max(GRADIENT_FLOOR, tau), max(TENSOR_FLOOR, TENSOR_FACTOR * tau))


def differences(got: Run, want: Run, tol: Tolerance) -> tuple[list[str], list[str]]:
    """(a line per quantity compared, a line per quantity out of tolerance or not finite)."""
    lines: list[str] = []
    bad: list[str] = []

    def check(name: str, error: float, limit: float) -> None:
        line = f"{name}: {error:.3g} (limit {limit:.3g})"
        lines.append(line)
        if not error <= limit:  # also catches NaN
            bad.append(line)

    same_tokens = all(torch.equal(a, b) for a, b in zip(got.rollout.completions, want.rollout.completions, strict=True))
    lines.append(f"sampled tokens identical: {same_tokens}")
    if not same_tokens:
        bad.append("sampled tokens differ")
    check(
        "sampling logits (prefill + cached decode)",
        rel_err(got.rollout.step_logits, want.rollout.step_logits),
        tol.forward,
    )
    check("sampler log-probs", rel_err(got.rollout.sampler_logprobs, want.rollout.sampler_logprobs), tol.forward)
    for name in ("logprobs", "ref_logprobs", "entropy"):
        check(f"per-token {name}", rel_err(getattr(got.step, name), getattr(want.step, name)), tol.forward)
    got_scalars, want_scalars = got.step.scalars(), want.step.scalars()
    for name, value in want_scalars.items():
        limit = tol.gradient if name == "grad_norm" else tol.forward
        check(f"{name} (error / its scale)", abs(got_scalars[name] - value) / want.step.scales[name], limit)
    got_update, want_update = _flat(got.step.updates), _flat(want.step.updates)
    check("whole update", rel_err(got_update, want_update), tol.gradient)
    total = want_update.norm().item()
    tensor_errors = {
        name: (got.step.updates[name] - update).norm().item() / (update.norm().item() + SMALL_TENSOR * total)
        for name, update in want.step.updates.items()
    }
    worst_name = max(tensor_errors, key=lambda n: _nan_high(tensor_errors[n]))
    worst = tensor_errors[worst_name]
    check(f"update of one tensor (worst: {worst_name})", worst, tol.tensor)
    finite = all(
        torch.isfinite(t).all()
        for t in (got.step.logprobs, got.step.ref_logprobs, got.step.entropy, got_update, got.rollout.step_logits)
    ) and all(torch.isfinite(torch.tensor(v)) for v in got_scalars.values())
    lines.append(f"everything finite: {finite}")
    if not finite:
        bad.append("non-finite values")
    return lines, bad


def _nan_high(x: float) -> float:
    return float("inf") if x != x else x


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors.values()])
