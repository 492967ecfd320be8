"""`fused_gdn_gating` in one kernel: g = -exp(A_log) * softplus(a + dt_bias) in fp32 and
beta = sigmoid(b) in b's dtype, for a, b [..., HV] flattened to rows.

softplus follows torch's (threshold 20: x itself above it), with log1p computed accurately for the
tiny exp(x) of very negative inputs, where log(1 + y) would round to 0.

The row count is a runtime argument that Triton does not specialize, and the row strides are those
of the caller's buffers (a projection's width, not the token count): no argument changes with the
number of tokens. Forward only, like the other serving kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import OpKernel, cdiv, device_guard, next_power_of_2, num_warps_for
from gdn.backends.triton.common.tiles import cast_as
from gdn.backends.triton.decode import refuse_grad
from gdn.backends.triton.launch import launch
from gdn.calls import GatingCall

SOFTPLUS_THRESHOLD = tl.constexpr(20.0)
# Elements per program: decode batches fit in one or two programs, prefill spreads over many.
TILE = 4096


@triton.jit
def _log1p(y):
    """log(1 + y) for y >= 0 to a few ulps: log(u) * y / (u - 1) with u = 1 + y cancels the rounding
    of u (Goldberg); where u rounds to 1, log1p(y) = y to fp32 precision."""
    u = 1.0 + y
    tiny = u == 1.0
    return tl.where(tiny, y, tl.log(u) * (y / tl.where(tiny, 1.0, u - 1.0)))


@triton.jit(do_not_specialize=["rows"])
def _gating_kernel(
    A_log_ptr,
    a_ptr,
    b_ptr,
    dt_bias_ptr,
    g_ptr,
    beta_ptr,
    rows,
    stride_a,
    stride_b,
    HV: tl.constexpr,
    BR: tl.constexpr,
    BH: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    h = tl.arange(0, BH)
    h_mask = h < HV
    mask = (r < rows)[:, None] & h_mask[None, :]
    A = tl.load(A_log_ptr + h, mask=h_mask, other=0.0).to(tl.float32)
    bias = tl.load(dt_bias_ptr + h, mask=h_mask, other=0.0).to(tl.float32)
    x = tl.load(a_ptr + r[:, None] * stride_a + h[None, :], mask=mask, other=0.0).to(tl.float32) + bias[None, :]
    softplus = tl.where(x > SOFTPLUS_THRESHOLD, x, _log1p(tl.exp(tl.minimum(x, SOFTPLUS_THRESHOLD))))
    out = r[:, None] * HV + h[None, :]
    tl.store(g_ptr + out, -tl.exp(A)[None, :] * softplus, mask=mask)
    b = tl.load(b_ptr + r[:, None] * stride_b + h[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(beta_ptr + out, cast_as(tl.sigmoid(b), beta_ptr), mask=mask)


def _rows(x: torch.Tensor, HV: int) -> torch.Tensor:
    """x [..., HV] as [rows, HV] with unit stride along HV; a view when the leading dims flatten to
    one stride (e.g. a slice of a wider projection), a copy otherwise."""
    flat = x.reshape(-1, HV)
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def fused_gdn_gating(call: GatingCall):
    """The `fused_gdn_gating` op of the triton backend (forward only). Returns (g fp32, beta in b's
    dtype), both shaped like a."""
    A_log, a, b, dt_bias = call.A_log, call.a, call.b, call.dt_bias
    refuse_grad("fused_gdn_gating", A_log=A_log, a=a, b=b, dt_bias=dt_bias)
    HV = A_log.shape[0]
    a2, b2 = _rows(a, HV), _rows(b, HV)
    rows = a2.shape[0]
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    if rows:
        BH = next_power_of_2(HV)
        BR = max(1, TILE // BH)
        with device_guard(a2):
            launch(_gating_kernel, (cdiv(rows, BR),))(
                A_log,
                a2,
                b2,
                dt_bias,
                g,
                beta,
                rows,
                a2.stride(0),
                b2.stride(0),
                HV=HV,
                BR=BR,
                BH=BH,
                num_warps=num_warps_for(BR * BH),
            )
    return g, beta


# The ops this module serves (TritonBackend.loader): a serving kernel without a backward; no matmul, so
# a few fp32 ulps from eager.
OPS = {"fused_gdn_gating": OpKernel(fused_gdn_gating, forward_only=True, probe_tolerance=1e-5)}
