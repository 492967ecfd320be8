"""The references the accuracy table measures against: the gated delta rule one token at a time and the
depthwise causal conv one tap at a time, in fp64, written for this table from the recurrences'
definitions and sharing no code with any backend (the eager backend is one of the backends measured).

Recurrence per value head, state S [K, V], from the initial state:

    S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t),   o_t = scale S_t^T q_t

with q_t, k_t the query/key head of the value head's group (HV / H value heads per query/key head), each
l2-normalised first when the call asks for it. Sequences run side by side, each to its own length.
Everything is differentiable, so the gradients of a loss through it are the fp64 reference gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6


def _l2normalise(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _spans(batch: int, tokens: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """(row, start, end) of each sequence."""
    if cu_seqlens is None:
        return [(b, 0, tokens) for b in range(batch)]
    bounds = cu_seqlens.tolist()
    return [(0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]


def gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; initial_state [N, HV, K, V]; cu_seqlens
    [N + 1] with B = 1. Returns (o [B, T, HV, V], final state [N, HV, K, V]) in fp64."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if l2norm:
        q, k = _l2normalise(q), _l2normalise(k)
    group = torch.arange(HV, device=q.device) // (HV // H)  # the query/key head of each value head
    q, k = q.index_select(2, group), k.index_select(2, group)  # [B, T, HV, K]
    spans = _spans(B, T, cu_seqlens)
    N, longest = len(spans), max((end - start for _, start, end in spans), default=0)

    def padded(x: torch.Tensor) -> torch.Tensor:
        """[N, longest, ...]: each sequence's tokens from its start, zeros after its end."""
        tail = x.shape[2:]
        return torch.stack([torch.cat([x[b, s:e], x.new_zeros(longest - (e - s), *tail)]) for b, s, e in spans])

    qs, ks, vs, gs, bs = (padded(t) for t in (q, k, v, g, beta))
    S = q.new_zeros(N, HV, K, V) if initial_state is None else initial_state.double()
    lengths = torch.tensor([end - start for _, start, end in spans], device=q.device)
    outputs = []
    for t in range(longest):
        decayed = S * torch.exp(gs[:, t])[..., None, None]
        u = bs[:, t, :, None] * (vs[:, t] - torch.einsum("nhk,nhkv->nhv", ks[:, t], decayed))
        updated = decayed + torch.einsum("nhk,nhv->nhkv", ks[:, t], u)
        outputs.append(scale * torch.einsum("nhk,nhkv->nhv", qs[:, t], updated))
        running = (t < lengths)[:, None, None, None]
        S = torch.where(running, updated, S)
    o_padded = torch.stack(outputs, dim=1)
    pieces = [o_padded[n, : end - start] for n, (_, start, end) in enumerate(spans)]
    o = torch.stack(pieces) if cu_seqlens is None else torch.cat(pieces)[None]
    return o, S


def causal_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    history: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: x [D, L] after history [D, W - 1]; out[d, t] = sum_j weight[d, j] * full[d, t + j]
    (+ bias, then SiLU for activation "silu"), full = history then x. Returns (out [D, L], the last W - 1
    columns of full) in fp64."""
    x, weight, history = x.double(), weight.double(), history.double()
    width = weight.shape[1]
    full = torch.cat([history, x], dim=-1)
    out = sum(weight[:, j, None] * full[:, j : j + x.shape[-1]] for j in range(width))
    if bias is not None:
        out = out + bias.double()[:, None]
    if activation in ("silu", "swish"):
        out = F.silu(out)
    return out, full[:, full.shape[-1] - (width - 1) :]
