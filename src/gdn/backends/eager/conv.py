"""Depthwise causal conv1d for prefill (dense or packed varlen) and for decode against a state pool."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gdn.calls import ConvCall, ConvUpdateCall
from gdn.pool_rows import offsets_in_order, pool_rows


def _activate(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    return F.silu(x) if activation in ("silu", "swish") else x


def _depthwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Valid (unpadded) depthwise conv in fp32: [B, D, L] -> [B, D, L - W + 1]."""
    return F.conv1d(
        x.float(), weight.float().unsqueeze(1), None if bias is None else bias.float(), groups=weight.shape[0]
    )


def causal_conv1d_fn(call: ConvCall):
    x, weight, bias, activation = call.x, call.weight, call.bias, call.activation
    if call.query_start_loc is not None:
        return _varlen(call)
    B, D, _T = x.shape
    width = weight.shape[1]
    initial_states = call.initial_states
    history = (
        initial_states.float() if initial_states is not None else x.new_zeros(B, D, width - 1, dtype=torch.float32)
    )
    extended = torch.cat([history, x.float()], dim=-1)  # [B, D, W - 1 + T]
    seq_idx = call.seq_idx
    out = _depthwise(extended, weight, bias) if seq_idx is None else _segmented(extended, weight, bias, seq_idx)
    out = _activate(out, activation).to(x.dtype)
    if call.return_final_states:
        return out, extended[..., extended.shape[-1] - (width - 1) :].to(x.dtype)
    return out


def _segmented(extended: torch.Tensor, weight, bias, seq_idx: torch.Tensor) -> torch.Tensor:
    """Packed sequences marked by seq_idx [B, T]: a tap never reads a token of another sequence."""
    width = weight.shape[1]
    # windows[b, d, t, j] = extended[b, d, t + j]; tap j reads token t - (W - 1 - j)
    windows = extended.unfold(-1, width, 1)
    # History before the batch start belongs to each row's first sequence.
    ids = torch.cat([seq_idx[:, :1].expand(-1, width - 1), seq_idx], dim=-1).unfold(-1, width, 1)
    same = (ids == seq_idx.unsqueeze(-1)).unsqueeze(1)  # [B, 1, T, W]
    out = (windows * same * weight.float().view(1, -1, 1, width)).sum(-1)
    return out if bias is None else out + bias.float().view(1, -1, 1)


def _varlen(call: ConvCall):
    """x [D, total_T]: each sequence reads its own W - 1 columns of history (from the pool when
    has_initial_state says so, else zeros), and its last W - 1 inputs are written back to the pool.
    Reaching here without the host checks, a sequence whose slot is out of range or repeated gets NaN
    outputs and its slot is neither read nor written; offsets out of order give every output NaN."""
    x, weight, bias, activation, conv_states = call.x, call.weight, call.bias, call.activation, call.conv_states
    query_start_loc, cache_indices, has_initial_state = call.query_start_loc, call.cache_indices, call.has_initial_state
    D, total = x.shape
    width = weight.shape[1]
    hist = width - 1
    bounds = query_start_loc.tolist()
    if not offsets_in_order(bounds, total):
        return torch.full_like(x, float("nan"))
    N = len(bounds) - 1
    slots, refused = list(range(N)), []
    if cache_indices is not None:
        plan = pool_rows(cache_indices.tolist(), conv_states.shape[0])
        slots, refused = plan.kept, plan.refused
    use_history = [False] * N if has_initial_state is None else has_initial_state.tolist()

    history = x.new_zeros(N, D, hist, dtype=torch.float32)
    if conv_states is not None:
        read = [n for n in range(N) if use_history[n] and slots[n] >= 0]
        if read:
            rows = torch.tensor(read, device=x.device)
            history = history.index_copy(
                0, rows, conv_states.index_select(0, torch.tensor([slots[n] for n in read], device=x.device)).float()
            )

    # Lay out [history_0, seq_0, history_1, seq_1, ...] and run one valid conv over it; each output
    # position whose window ends inside a sequence sees only that sequence and its history.
    pieces, positions, cursor = [], [], 0
    for n in range(N):
        length = bounds[n + 1] - bounds[n]
        pieces += [history[n], x[:, bounds[n] : bounds[n + 1]].float()]
        positions.append(torch.arange(cursor + hist, cursor + hist + length))
        cursor += hist + length
    extended = torch.cat(pieces, dim=-1).unsqueeze(0)
    conv = _depthwise(extended, weight, bias)[0]  # output i ends at extended position i + W - 1
    take = torch.cat(positions).to(x.device) - hist
    out = _activate(conv.index_select(1, take), activation).to(x.dtype)
    for n in refused:
        out[:, bounds[n] : bounds[n + 1]] = float("nan")

    if conv_states is not None and hist > 0:
        with torch.no_grad():
            ends = torch.tensor(bounds[1:], dtype=torch.long) + torch.arange(1, N + 1) * hist
            cols = (ends.unsqueeze(1) - hist + torch.arange(hist)).to(x.device)  # [N, W - 1]
            finals = extended[0].index_select(1, cols.flatten()).view(D, N, hist).permute(1, 0, 2)
            write = [n for n in range(N) if slots[n] >= 0]
            if write:
                targets = torch.tensor([slots[n] for n in write], dtype=torch.long, device=x.device)
                conv_states.index_copy_(0, targets, finals[write].to(conv_states.dtype))
    return out


def causal_conv1d_update(call: ConvUpdateCall):
    """One or a few new tokens per row; conv_state [slots, D, state_len] is updated in place. Rows whose
    index is -1 are skipped: their output is zero and no pool row changes; a slot out of range or
    repeated (reaching here without the host check) gives NaN outputs and changes no pool row."""
    x, conv_state, weight, bias, activation = call.x, call.conv_state, call.weight, call.bias, call.activation
    conv_state_indices = call.conv_state_indices
    squeeze = x.ndim == 2
    xs = x.unsqueeze(-1) if squeeze else x
    B, D, L = xs.shape
    state_len = conv_state.shape[-1]
    width = weight.shape[1]
    if conv_state_indices is None:
        rows = list(range(B))
        slots, refused = rows, []
    else:
        plan = pool_rows(conv_state_indices.tolist(), conv_state.shape[0])
        rows, refused = plan.served, plan.refused
        slots = [plan.kept[b] for b in rows]
    out = xs.new_zeros(B, D, L)
    if refused:
        out[refused] = float("nan")
    if rows:
        row_idx = torch.tensor(rows, device=x.device)
        slot_idx = torch.tensor(slots, device=x.device)
        states = conv_state.index_select(0, slot_idx)
        extended = torch.cat([states.float(), xs.index_select(0, row_idx).float()], dim=-1)
        conv = _depthwise(extended[..., state_len - (width - 1) :], weight, bias)
        out = out.index_copy(0, row_idx, _activate(conv, activation).to(x.dtype))
        with torch.no_grad():
            conv_state.index_copy_(0, slot_idx, extended[..., extended.shape[-1] - state_len :].to(conv_state.dtype))
    return out.squeeze(-1) if squeeze else out
