"""Row-wise l2norm in Triton: y = x * rstd with rstd = rsqrt(sum(x^2) + eps), in fp32.

Backward: with r = rstd and s = sum(x^2), dr/dx_j = -r^3 x_j, so
    dx = r * dy - r^3 * x * (x . dy) = r * (dy - y * (y . dy)),
which needs only the output y and r: the forward input is not kept.

The row count is a runtime argument that Triton does not specialize (do_not_specialize), and no
other argument depends on it: a new token count never compiles a new binary. (A runtime int is
otherwise specialized by divisibility by 16, and a derived argument such as a block count flips
its class between row counts: fla_npu's l2norm compiled a binary per row count that way.) D and the
block sizes are constexpr: they follow the head dim, which is fixed for a model.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import OpKernel, cdiv, device_guard, next_power_of_2, num_warps_for
from gdn.backends.triton.launch import launch
from gdn.calls import L2NormCall

# Up to this many columns a row lives in one block (head dims are 64..256); wider rows are swept in
# blocks of this size, twice (sum of squares, then scale).
MAX_BLOCK_D = 512
# Elements per program: several rows per program keeps short rows from leaving threads idle.
TILE = 8192


@triton.jit
def _row_tile(rows, D: tl.constexpr, BD: tl.constexpr, BR: tl.constexpr):
    """A program's BR rows of D elements -> (their indices in 64 bits, which of them exist, a block's
    column offsets, each row's first element)."""
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    return r, r < rows, tl.arange(0, BD), r[:, None] * D


@triton.jit(do_not_specialize=["rows"])
def _l2norm_fwd_kernel(
    x_ptr,
    y_ptr,
    rstd_ptr,
    rows,
    eps,
    D: tl.constexpr,
    BD: tl.constexpr,
    BR: tl.constexpr,
):
    r, row_mask, cols, base = _row_tile(rows, D, BD, BR)
    if D <= BD:
        mask = row_mask[:, None] & (cols[None, :] < D)
        x = tl.load(x_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) + eps)
        tl.store(y_ptr + base + cols[None, :], (x * rstd[:, None]).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BR], dtype=tl.float32)
        for start in range(0, D, BD):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < D)
            x = tl.load(x_ptr + base + c[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += tl.sum(x * x, axis=1)
        rstd = tl.rsqrt(acc + eps)
        for start in range(0, D, BD):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < D)
            x = tl.load(x_ptr + base + c[None, :], mask=mask, other=0.0).to(tl.float32)
            tl.store(y_ptr + base + c[None, :], (x * rstd[:, None]).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + r, rstd, mask=row_mask)


@triton.jit
def grad_rows(y, dy, rstd):
    """dL/dx of whole rows from y, dL/dy (fp32) and each row's rstd: rstd (dy - y (y . dy)). The WY
    backward applies it to its own dq and dk sums (gdn.backends.triton.common.wy_bwd)."""
    yf = y.to(tl.float32)
    return rstd[:, None] * (dy - yf * tl.sum(yf * dy, axis=1)[:, None])


@triton.jit(do_not_specialize=["rows"])
def _l2norm_bwd_kernel(
    y_ptr,
    rstd_ptr,
    dy_ptr,
    dx_ptr,
    rows,
    D: tl.constexpr,
    BD: tl.constexpr,
    BR: tl.constexpr,
):
    r, row_mask, cols, base = _row_tile(rows, D, BD, BR)
    rstd = tl.load(rstd_ptr + r, mask=row_mask, other=0.0)
    if D <= BD:
        mask = row_mask[:, None] & (cols[None, :] < D)
        y = tl.load(y_ptr + base + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dx = grad_rows(y, dy, rstd)
        tl.store(dx_ptr + base + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        proj = tl.zeros([BR], dtype=tl.float32)
        for start in range(0, D, BD):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < D)
            y = tl.load(y_ptr + base + c[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + base + c[None, :], mask=mask, other=0.0).to(tl.float32)
            proj += tl.sum(y * dy, axis=1)
        for start in range(0, D, BD):
            c = start + cols
            mask = row_mask[:, None] & (c[None, :] < D)
            y = tl.load(y_ptr + base + c[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + base + c[None, :], mask=mask, other=0.0).to(tl.float32)
            dx = rstd[:, None] * (dy - y * proj[:, None])
            tl.store(dx_ptr + base + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


def launch_config(D: int) -> dict[str, int]:
    """Constexpr block sizes and warps for rows of D elements (a function of D only)."""
    BD = min(next_power_of_2(D), MAX_BLOCK_D)
    BR = max(1, TILE // BD)
    return dict(BD=BD, BR=BR, num_warps=num_warps_for(BR * BD))


def l2norm_fwd(x: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (y in x's dtype, rstd fp32 [...]); rows are x's leading dims flattened."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D).contiguous()
    rows = x2.shape[0]
    y = torch.empty_like(x2)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        cfg = launch_config(D)
        with device_guard(x2):
            launch(_l2norm_fwd_kernel, (cdiv(rows, cfg["BR"]),))(x2, y, rstd, rows, float(eps), D=D, **cfg)
    return y.view(x.shape), rstd.view(x.shape[:-1])


def l2norm_bwd(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dL/dx from the forward's y and rstd and dL/dy; returned in y's dtype and shape."""
    D = y.shape[-1]
    y2 = y.reshape(-1, D).contiguous()
    dy2 = dy.reshape(-1, D).contiguous()
    rstd1 = rstd.reshape(-1).contiguous()
    rows = y2.shape[0]
    dx = torch.empty_like(y2)
    if rows:
        cfg = launch_config(D)
        with device_guard(y2):
            launch(_l2norm_bwd_kernel, (cdiv(rows, cfg["BR"]),))(y2, rstd1, dy2, dx, rows, D=D, **cfg)
    return dx.view(y.shape)


class L2Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float) -> torch.Tensor:
        y, rstd = l2norm_fwd(x, eps)
        ctx.save_for_backward(y, rstd)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, None]:
        y, rstd = ctx.saved_tensors
        return l2norm_bwd(y, rstd, dy), None


def l2norm(call: L2NormCall) -> torch.Tensor:
    """The `l2norm` op of the triton backend (differentiable in x)."""
    return L2Norm.apply(call.x, call.eps)


# The ops this module serves (TritonBackend.loader). No matmul: a few fp32 ulps from eager (the GPU's
# rsqrt is approximate to about 2^-22).
OPS = {"l2norm": OpKernel(l2norm, probe_tolerance=1e-5)}
