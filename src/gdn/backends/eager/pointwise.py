"""Row-wise l2norm and the GDN gate, computed in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn.calls import GatingCall, L2NormCall


def l2norm(call: L2NormCall) -> torch.Tensor:
    xf = call.x.float()
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + call.eps)).to(call.x.dtype)


def fused_gdn_gating(call: GatingCall):
    """g = -exp(A_log) * softplus(a + dt_bias) in fp32; beta = sigmoid(b) in b's dtype."""
    g = -call.A_log.float().exp() * F.softplus(call.a.float() + call.dt_bias.float())
    return g, torch.sigmoid(call.b.float()).to(call.b.dtype)
