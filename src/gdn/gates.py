"""A gate of -inf is a complete decay: exp(g) = 0, the state before the token is forgotten. It is a
valid value, and the token recurrence takes it as it is. The chunked form does not: it takes
differences of cumulative gates inside a chunk (G_i - G_j, or sums over a segment by a matmul with a
0/1 matrix), and there -inf - -inf and -inf * 0 are NaN. So the chunked implementations raise every
gate below GATE_FLOOR to it before they sum gates.

That changes no value in fp32 for gates <= 0 (log decays, what fused_gdn_gating gives): exp of a sum
of gates that includes a floored one is at most exp(-128), which is 0 in fp32 (its smallest
subnormal is exp(-103.3)), as exp(-inf) is. What it costs is the absolute precision of cumulative
gates near the floor inside that chunk (ulp(128) = 2^-16, a relative error of about 1.5e-5 in the
decays between the tokens after a floored gate), which gates that sum to -128 in a chunk cost anyway.
A floored gate's gradient is 0, the slope of exp at -inf (autograd of `floored`; the triton chunk
kernels floor where they load the gate and give it 0 up to the rounding of their gate-gradient sums).
"""

from __future__ import annotations

import torch

GATE_FLOOR = -128.0


def floored(g: torch.Tensor) -> torch.Tensor:
    """g with every gate below GATE_FLOOR (-inf among them) raised to it; no gradient flows to those."""
    return g.clamp_min(GATE_FLOOR)
