"""fp64 references written for the tests, independent of gdn's code: the token-by-token gated delta
recurrence and a direct causal conv."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||, in fp64."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def gdn_recurrence(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, l2norm=False):
    """The gated delta rule one token at a time in fp64. Returns (o [B, T, HV, V], final [N, HV, K, V])."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    scale = K**-0.5 if scale is None else scale
    heads = torch.arange(HV) // (HV // H)  # value head -> its query/key head
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        bounds = cu_seqlens.tolist()
        spans = [(0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]
    rows: list[list[torch.Tensor]] = [[] for _ in range(B)]
    finals = []
    for n, (b, start, end) in enumerate(spans):
        if initial_state is None:
            S = torch.zeros(HV, K, V, dtype=torch.float64, device=q.device)
        else:
            S = initial_state[n].double()
        for t in range(start, end):
            q_t, k_t = q[b, t, heads], k[b, t, heads]  # [HV, K]
            S = S * torch.exp(g[b, t])[:, None, None]
            u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hk,hkv->hv", k_t, S))
            S = S + torch.einsum("hk,hv->hkv", k_t, u)
            rows[b].append(scale * torch.einsum("hk,hkv->hv", q_t, S))
        finals.append(S)
    return torch.stack([torch.stack(r) for r in rows]), torch.stack(finals)


def causal_conv(x, weight, bias=None, activation=None, history=None):
    """x [B, D, T] with optional history [B, D, W - 1] before it; fp64, one tap at a time."""
    x = x.double()
    B, D, T = x.shape
    W = weight.shape[1]
    hist = torch.zeros(B, D, W - 1, dtype=torch.float64) if history is None else history.double()
    full = torch.cat([hist, x], dim=-1)
    out = torch.zeros(B, D, T, dtype=torch.float64)
    for t in range(T):
        for j in range(W):
            out[:, :, t] += weight[:, j].double() * full[:, :, t + j]
    if bias is not None:
        out += bias.double()[None, :, None]
    if activation in ("silu", "swish"):
        out = F.silu(out)
    return out
