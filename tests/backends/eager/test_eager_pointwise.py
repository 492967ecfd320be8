"""Eager l2norm and fused_gdn_gating against their formulas in fp64, with gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gdn
from reference import rel_err

pytestmark = pytest.mark.single_op


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [3, 60, 128])
def test_l2norm(dtype, D, gen):
    x = torch.randn(3, 37, D, generator=gen).to(dtype)
    xl, xr = x.clone().requires_grad_(), x.double().requires_grad_()
    out = gdn.l2norm(xl)
    ref = xr / torch.sqrt((xr * xr).sum(-1, keepdim=True) + 1e-6)
    assert out.dtype == dtype
    up = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    (out.double() * up).sum().backward()
    (ref * up).sum().backward()
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert rel_err(out, ref) < tol and rel_err(xl.grad, xr.grad) < tol


def test_gating(gen):
    HV = 8
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    a, b = torch.randn(5, 9, HV, generator=gen) * 10, torch.randn(5, 9, HV, generator=gen).bfloat16()
    leaves = [t.clone().requires_grad_() for t in (A_log, a, b, dt_bias)]
    refs = [t.double().requires_grad_() for t in (A_log, a, b, dt_bias)]
    g, beta = gdn.fused_gdn_gating(*leaves)
    rA, ra, rb, rdt = refs
    g_ref, beta_ref = -rA.exp() * F.softplus(ra + rdt), torch.sigmoid(rb)
    assert g.dtype == torch.float32 and beta.dtype == torch.bfloat16 and g.shape == a.shape
    assert rel_err(g, g_ref) < 1e-6 and rel_err(beta, beta_ref) < 1e-2
    (g.double().sum() + beta.double().sum()).backward()
    (g_ref.sum() + beta_ref.sum()).backward()
    for name, got, want in zip(("A_log", "a", "b", "dt_bias"), leaves, refs, strict=True):
        assert rel_err(got.grad, want.grad) < (1e-2 if name == "b" else 1e-6), name
