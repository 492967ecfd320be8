"""Stand-in math of fla_npu's `npu_recurrent_gated_delta_rule` (NOT the real kernel).

Token-major inputs: query, key [T, NK, DK], value [T, NV, DV], beta [T, NV] (bf16), g [T, NV] (fp32);
the state pool is value-first, state [blocks, NV, DV, DK] (bf16 or fp32), updated in place.
actual_seq_lengths [N + 1] holds a leading prefix entry, then the length of each sequence;
ssm_state_indices [T] names, per token, the state block its updated state is written to, and a
sequence starts from the block of its first token. Per token, per value head:

    S = exp(g) S;  S = S + beta (v - S k) k^T;  o = S (scale q)
"""

from __future__ import annotations

import torch

from standins import _checks as check

OP = "npu_recurrent_gated_delta_rule"


def _require(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...], rank: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{OP}: {name} must be a torch.Tensor, got {type(t).__name__}.")
    if t.device != device:
        raise TypeError(f"{OP}: {name} must be on the query's device {device}, got {t.device}.")
    if t.dtype not in dtypes:
        raise TypeError(f"{OP}: {name} dtype must be one of {dtypes}, got {t.dtype}.")
    if t.ndim != rank:
        raise RuntimeError(f"{OP}: {name} must be rank {rank}, got shape {tuple(t.shape)}.")


def npu_recurrent_gated_delta_rule(
    query,
    key,
    value,
    state,
    *,
    beta,
    scale=1.0,
    actual_seq_lengths,
    ssm_state_indices,
    num_accepted_tokens=None,
    g=None,
    gk=None,
):
    check.not_modelled(OP, num_accepted_tokens=num_accepted_tokens, gk=gk)
    if g is None:
        raise RuntimeError(f"{OP}: either g or gk must be provided.")
    device = query.device
    bf16, idx = (torch.bfloat16,), (torch.int32,)
    for name, t, dtypes, rank in (
        ("query", query, bf16, 3),
        ("key", key, bf16, 3),
        ("value", value, bf16, 3),
        ("beta", beta, bf16, 2),
        ("state", state, (torch.bfloat16, torch.float32), 4),
        ("actual_seq_lengths", actual_seq_lengths, idx, 1),
        ("ssm_state_indices", ssm_state_indices, idx, 1),
        ("g", g, (torch.float32,), 2),
    ):
        _require(name, t, dtypes, rank, device)
    if state.requires_grad:
        raise RuntimeError(f"{OP} mutates state in place; it must not require grad.")
    tokens, nk, dk = query.shape
    nv, dv = value.shape[1], value.shape[2]
    check.shape(OP, "key", key, (tokens, nk, dk))
    check.shape(OP, "value", value, (tokens, nv, dv))
    check.shape(OP, "beta", beta, (tokens, nv))
    check.shape(OP, "g", g, (tokens, nv))
    check.shape(OP, "state", state, (state.shape[0], nv, dv, dk))
    check.shape(OP, "ssm_state_indices", ssm_state_indices, (tokens,))
    if nv % nk or nk > 256 or nv > 256 or dk > 512 or dv > 512:
        raise RuntimeError(f"{OP}: unsupported heads/dims Nk={nk}, Nv={nv}, Dk={dk}, Dv={dv}.")
    lengths = [int(n) for n in actual_seq_lengths.tolist()]
    if len(lengths) < 2 or sum(lengths[1:]) + lengths[0] != tokens:
        raise RuntimeError(f"{OP}: actual_seq_lengths {lengths} do not cover the {tokens} tokens.")
    if min(lengths[1:]) <= 0:
        raise RuntimeError(f"{OP}: sequence lengths must be positive, got actual_seq_lengths {lengths}.")
    blocks = [int(b) for b in ssm_state_indices.tolist()]
    heads = torch.arange(nv, device=device) // (nv // nk)
    out = torch.empty_like(value)
    cursor = lengths[0]
    for length in lengths[1:]:
        s = state[blocks[cursor]].float()  # [NV, DV, DK]
        for t in range(cursor, cursor + length):
            q_t, k_t = query[t, heads].float() * scale, key[t, heads].float()
            s = s * g[t].exp().view(nv, 1, 1)
            delta = (value[t].float() - (s @ k_t.unsqueeze(-1)).squeeze(-1)) * beta[t].float().unsqueeze(-1)
            s = s + delta.unsqueeze(-1) * k_t.unsqueeze(1)
            out[t] = (s @ q_t.unsqueeze(-1)).squeeze(-1).to(out.dtype)
            state[blocks[t]] = s.to(state.dtype)
        cursor += length
    return out
