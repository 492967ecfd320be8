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
    if state.requires_grad:
        raise RuntimeError(f"{OP} mutates state in place; it must not require grad.")
    tokens, nk, _ = query.shape
    nv = value.shape[1]
    if nv % nk:
        raise RuntimeError(f"{OP}: Nv must be an integer multiple of Nk, got Nv={nv}, Nk={nk}.")
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
