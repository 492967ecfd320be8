"""Stand-in math of fla_npu's causal conv1d AscendC ops (NOT the real kernels).

Channels-last layouts: x [T, D] (sequences packed along T, bounds in query_start_loc), weight
[W, D] (tap W - 1 multiplies the current token), conv states [slots, W - 1, D] (oldest first). The
forward reads a sequence's history from conv_states[cache_indices[n]] where its initial-state flag
is set (zeros otherwise) and writes the sequence's last W - 1 inputs back there. The backward takes
history and its gradient as [N, W, D] with slot 0 unused, as the op does.

Three entries share that math: the raw `npu_causal_conv1d` (host int lists: query_start_loc,
cache_indices, initial_state_mode; activation_mode 0 = none, 1 = silu), the 26.10
`npu_causal_conv1d_fn` (device metadata tensors plus their host twins; activation by name) and
`npu_causal_conv1d_bwd` (layout "NTD": x [T, D] or [1, T, D], dy [1, T, D]).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from standins import _checks as check

ACTIVATIONS = {None: 0, "none": 0, "silu": 1, "swish": 2}


def _bounds(op: str, query_start_loc, tokens: int) -> list[int]:
    bounds = None if query_start_loc is None else list(query_start_loc)
    if bounds is None:
        raise NotImplementedError(f"{op} stand-in: only the varlen [T, D] layout with query_start_loc is modelled")
    if bounds[0] != 0 or bounds[-1] != tokens or any(b <= a for a, b in itertools.pairwise(bounds)):
        raise RuntimeError(f"{op}: query_start_loc {bounds} must rise strictly from 0 to T = {tokens}")
    return bounds


def _conv(history: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """history [W - 1, D], x [L, D], weight [W, D] (fp32) -> pre-activation [L, D]."""
    extended = torch.cat([history, x]).t().unsqueeze(0)  # [1, D, W - 1 + L]
    out = F.conv1d(extended, weight.t().unsqueeze(1), bias, groups=weight.shape[1])
    return out[0].t()


def causal_conv1d_varlen(
    op: str, x, weight, bias, conv_states, bounds, slots, initial, activation: int, pad_slot_id: int
) -> torch.Tensor:
    if x.ndim != 2 or weight.ndim != 2 or weight.shape[1] != x.shape[1]:
        raise NotImplementedError(f"{op} stand-in: x [T, D] with weight [W, D] only, got {tuple(x.shape)}")
    width, dim = weight.shape
    sequences = len(bounds) - 1
    slots = list(range(sequences)) if slots is None else slots
    initial = [0] * sequences if initial is None else initial
    out = torch.empty_like(x)
    finals = []
    for n in range(sequences):
        reads = conv_states is not None and initial[n] and slots[n] != pad_slot_id
        history = conv_states[slots[n]].float() if reads else x.new_zeros(width - 1, dim, dtype=torch.float32)
        seq = x[bounds[n] : bounds[n + 1]].float()
        y = _conv(history, seq, weight.float(), None if bias is None else bias.float())
        out[bounds[n] : bounds[n + 1]] = (F.silu(y) if activation else y).to(out.dtype)
        finals.append(torch.cat([history, seq])[seq.shape[0] :])
    if conv_states is not None:
        for n in range(sequences):
            if slots[n] != pad_slot_id:
                conv_states[slots[n]] = finals[n].to(conv_states.dtype)
    return out


def npu_causal_conv1d(
    x,
    weight,
    bias=None,
    conv_states=None,
    *,
    query_start_loc=None,
    cache_indices=None,
    initial_state_mode=None,
    num_accepted_tokens=None,
    activation_mode=0,
    pad_slot_id=-1,
    run_mode=0,
    head_num=0,
):
    op = "npu_causal_conv1d"
    check.not_modelled(op, num_accepted_tokens=num_accepted_tokens, run_mode=run_mode, head_num=head_num)
    return causal_conv1d_varlen(
        op,
        x,
        weight,
        bias,
        conv_states,
        _bounds(op, query_start_loc, x.shape[0]),
        None if cache_indices is None else list(cache_indices),
        None if initial_state_mode is None else list(initial_state_mode),
        activation_mode,
        pad_slot_id,
    )


def _metadata(tensor: torch.Tensor | None, host: list[int] | None) -> list[int] | None:
    """One of a device / host pair (the contract admits at most one) as host ints."""
    if tensor is None:
        return None if host is None else list(host)
    return [int(v) for v in tensor.tolist()]


def npu_causal_conv1d_fn(
    x,
    weight,
    bias,
    conv_states=None,
    query_start_loc=None,
    cache_indices=None,
    has_initial_state=None,
    activation="silu",
    pad_slot_id=-1,
    *,
    query_start_loc_cpu=None,
    cache_indices_cpu=None,
    has_initial_state_cpu=None,
    head_num=0,
):
    op = "npu_causal_conv1d_fn"
    check.not_modelled(op, head_num=head_num)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be None, 'silu' or 'swish', got {activation!r}")
    return causal_conv1d_varlen(
        op,
        x,
        weight,
        bias,
        conv_states,
        _bounds(op, _metadata(query_start_loc, query_start_loc_cpu), x.shape[0]),
        _metadata(cache_indices, cache_indices_cpu),
        _metadata(has_initial_state, has_initial_state_cpu),
        ACTIVATIONS[activation],
        pad_slot_id,
    )


def npu_causal_conv1d_bwd(
    x, y, weight, dy, initial_state=None, dht=None, *, query_start_loc=None, activation=0, input_layout="BSND"
):
    """(dx, dw, db, dh0): gradients of the pre-activation conv; with activation 1 or 2, dy is taken
    through silu at the given pre-activation y first."""
    op = "npu_causal_conv1d_bwd"
    check.not_modelled(op, dht=dht)
    if input_layout != "NTD":
        raise NotImplementedError(f"{op} stand-in: input_layout {input_layout!r} is not modelled (NTD only)")
    width, dim = weight.shape
    tokens = x.reshape(-1, dim)
    grad = dy.reshape(-1, dim).float()
    if activation:
        if y is None:
            raise RuntimeError(f"{op}: y is required when activation is enabled")
        pre = y.reshape(-1, dim).float()
        sig = torch.sigmoid(pre)
        grad = grad * sig * (1 + pre * (1 - sig))
    bounds = _bounds(op, query_start_loc, tokens.shape[0])
    sequences = len(bounds) - 1
    dx = torch.empty_like(tokens)
    dw = torch.zeros(width, dim, dtype=torch.float32, device=x.device)
    dh0 = torch.zeros(sequences, width, dim, dtype=torch.float32, device=x.device)
    for n in range(sequences):
        seq = tokens[bounds[n] : bounds[n + 1]].float().requires_grad_()
        history = (
            x.new_zeros(width - 1, dim, dtype=torch.float32) if initial_state is None else initial_state[n, 1:].float()
        ).requires_grad_()
        w = weight.float().requires_grad_()
        with torch.enable_grad():
            out = _conv(history, seq, w, None)
            d_seq, d_history, d_w = torch.autograd.grad(out, (seq, history, w), grad[bounds[n] : bounds[n + 1]])
        dx[bounds[n] : bounds[n + 1]] = d_seq.to(dx.dtype)
        dh0[n, 1:] = d_history
        dw += d_w
    return dx.view_as(x), dw.to(weight.dtype), grad.sum(0).to(weight.dtype), dh0.to(x.dtype)
