"""Inputs of a small pool decode step, shared by the tests of prepared steps (tests/ops/test_prepared.py,
tests/ops/test_dispatch_steps.py): one token per sequence, fresh random values each call."""

from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
B, H, HV, K, V, SLOTS = 3, 1, 2, 16, 16, 8


def tokens(gen: torch.Generator, batch: int = B) -> tuple[torch.Tensor, ...]:
    """q, k, v, g, beta of one token per sequence (k scaled down, g negative: a stable recurrence)."""

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)

    q, k, v = randn(batch, 1, H, K), randn(batch, 1, H, K, scale=K**-0.5), randn(batch, 1, HV, V)
    g = (-torch.rand(batch, 1, HV, generator=gen) * 0.5).to(DEVICE)
    beta = torch.rand(batch, 1, HV, generator=gen).to(DEVICE)
    return q, k, v, g, beta


def new_pool(gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(SLOTS, HV, K, V, generator=gen) * 0.1).to(DEVICE)
