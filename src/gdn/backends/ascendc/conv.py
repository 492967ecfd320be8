"""causal_conv1d_fn on fla_npu's AscendC causal conv, forward and backward.

The kernels are channels-last: x [tokens, D] with sequences packed along the tokens, weight [W, D],
conv states [sequences, W - 1, D]. Every call, dense or varlen, runs as one varlen call: each
sequence's history (its initial state, a pool row, or zeros) goes in as a scratch state row that the
kernel reads and overwrites with the sequence's last W - 1 inputs. The kernel runs without
activation; silu is applied in torch, so the backward op only sees the pre-activation gradient.

Entries differ by route. Stable (26.10): `npu_causal_conv1d_fn` takes the metadata as device tensors
plus host twins, else the deprecated raw `npu_causal_conv1d` takes host int lists. Legacy: the raw op
through torch.ops.npu, and the backward split per sequence, which is how fla_npu 26.6 gets an accurate
dw. Backward: `npu_causal_conv1d_bwd` in the NTD layout (x [tokens, D], dy [1, tokens, D]) with the
history as [sequences, W, D], slot 0 unused, and its gradient in the same layout.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gdn.backends.ascendc.knobs import kernel_dtype
from gdn.backends.ascendc.raw import CONV_BWD, CONV_FN, CONV_RAW, LEGACY, RawOps
from gdn.calls import ConvCall
from gdn.pool_rows import offsets_in_order, pool_rows

PAD_SLOT_ID = -1


def _fn_forward(entry: Callable) -> Callable:
    # The metadata goes in as the host `_cpu` lists only: later builds refuse a device tensor and its
    # host twin together ("X and X_cpu are mutually exclusive"), and the host lists spare the op a
    # device-to-host copy.
    def forward(x, weight, bias, states, bounds: list[int]):
        count = len(bounds) - 1
        return entry(
            x,
            weight,
            bias,
            conv_states=states,
            activation=None,
            pad_slot_id=PAD_SLOT_ID,
            query_start_loc_cpu=bounds,
            cache_indices_cpu=list(range(count)),
            has_initial_state_cpu=[1] * count,
        )

    return forward


def _host_list_forward(entry: Callable) -> Callable:
    def forward(x, weight, bias, states, bounds: list[int]):
        count = len(bounds) - 1
        return entry(
            x,
            weight,
            bias,
            states,
            query_start_loc=bounds,
            cache_indices=list(range(count)),
            initial_state_mode=[1] * count,
            activation_mode=0,
            pad_slot_id=PAD_SLOT_ID,
        )

    return forward


def _ntd_backward(entry: Callable) -> Callable:
    def backward(x, weight, dy, initial, bounds: list[int]):
        dx, dw, db, dh0 = entry(
            x, None, weight, dy.unsqueeze(0), initial, None, query_start_loc=bounds, activation=0, input_layout="NTD"
        )
        return dx.reshape_as(x), dw, db, dh0

    return backward


def _per_sequence(backward: Callable) -> Callable:
    def split(x, weight, dy, initial, bounds: list[int]):
        parts = [
            backward(x[a:b], weight, dy[a:b], initial[n : n + 1], [0, b - a])
            for n, (a, b) in enumerate(itertools.pairwise(bounds))
        ]
        dw = torch.stack([p[1].float() for p in parts]).sum(0)
        db = torch.stack([p[2].float() for p in parts]).sum(0)
        dx, dh0 = torch.cat([p[0] for p in parts]), torch.cat([p[3] for p in parts])
        return dx, dw.to(weight.dtype), db.to(weight.dtype), dh0

    return split


@dataclass(frozen=True)
class ConvKernels:
    forward: Callable
    backward: Callable
    entry: str  # which forward entry runs, for the records

    @classmethod
    def bind(cls, ops: RawOps) -> ConvKernels:
        backward = _ntd_backward(ops.get(CONV_BWD))
        if ops.route == LEGACY:
            return cls(_host_list_forward(ops.get(CONV_RAW)), _per_sequence(backward), ops.where(CONV_RAW))
        if ops.has(CONV_FN):
            return cls(_fn_forward(ops.get(CONV_FN)), backward, ops.where(CONV_FN))
        return cls(_host_list_forward(ops.get(CONV_RAW)), backward, ops.where(CONV_RAW) + " (host lists)")


@dataclass(frozen=True)
class _Run:
    kernels: ConvKernels
    bounds: list[int]


class _Conv(torch.autograd.Function):
    """(x [tokens, D], weight [W, D], bias, history [sequences, W - 1, D]) -> (pre-activation, the
    sequences' final states); differentiable in x, weight, bias and history."""

    @staticmethod
    def forward(ctx, x, weight, bias, history, call: _Run):
        states = history.clone()
        y = call.kernels.forward(x, weight, bias, states, call.bounds)
        ctx.save_for_backward(x, weight, history)
        ctx.call, ctx.has_bias = call, bias is not None
        ctx.mark_non_differentiable(states)
        return y, states

    @staticmethod
    def backward(ctx, dy, _dstates):
        x, weight, history = ctx.saved_tensors
        initial = torch.cat([history.new_zeros(history.shape[0], 1, history.shape[2]), history], dim=1)
        dx, dw, db, dh0 = ctx.call.kernels.backward(x, weight, dy.contiguous(), initial, ctx.call.bounds)
        return dx, dw, db if ctx.has_bias else None, dh0[:, 1:], None


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return F.silu(y.float()) if activation in ("silu", "swish") else y.float()


def _bounds(lengths: list[int]) -> list[int]:
    bounds = [0]
    for size in lengths:
        bounds.append(bounds[-1] + size)
    return bounds


def _dense(kernels: ConvKernels, call: ConvCall):
    x, weight, bias, activation, initial_states = call.x, call.weight, call.bias, call.activation, call.initial_states
    B, D, T = x.shape
    width = weight.shape[1]
    dtype = kernel_dtype(x.dtype)
    lengths, firsts = [], []
    for row in call.seq_idx.tolist() if call.seq_idx is not None else [[0] * T] * B:
        firsts.append(len(lengths))
        cuts = [t for t in range(1, T) if row[t] != row[t - 1]]
        lengths += [b - a for a, b in itertools.pairwise([0, *cuts, T])]
    # history before a row belongs to the row's first sequence only
    history = x.new_zeros(len(lengths), width - 1, D, dtype=dtype)
    if initial_states is not None:
        rows = torch.tensor(firsts, device=x.device)
        history = history.index_copy(0, rows, initial_states.transpose(1, 2).to(dtype))
    tokens = x.transpose(1, 2).reshape(B * T, D).to(dtype)
    w = weight.t().to(dtype).contiguous()
    b = None if bias is None else bias.to(dtype)
    y, _ = _Conv.apply(tokens, w, b, history, _Run(kernels, _bounds(lengths)))
    out = _activate(y, activation).view(B, T, D).transpose(1, 2).to(x.dtype)
    if not call.return_final_states:
        return out
    start = initial_states.float() if initial_states is not None else x.new_zeros(B, D, width - 1, dtype=torch.float32)
    extended = torch.cat([start, x.float()], dim=-1)
    return out, extended[..., extended.shape[-1] - (width - 1) :].to(x.dtype)


def _varlen(kernels: ConvKernels, call: ConvCall):
    """The pool's rows are read and written here, in torch, from the slots read on the host: reaching
    here without the host checks, a sequence whose slot is out of range or repeated gets NaN outputs and
    its slot is neither read nor written, and offsets out of order give every output NaN
    (gdn.pool_rows); the kernel sees only scratch rows."""
    x, weight, bias, activation, conv_states = call.x, call.weight, call.bias, call.activation, call.conv_states
    D, tokens = x.shape
    width = weight.shape[1]
    dtype = kernel_dtype(x.dtype)
    bounds = call.query_start_loc.tolist()
    if not offsets_in_order(bounds, tokens):
        return torch.full_like(x, float("nan"))
    count = len(bounds) - 1
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    slots, refused = list(range(count)), []
    if call.cache_indices is not None:
        rows = pool_rows(call.cache_indices.tolist(), conv_states.shape[0])
        slots, refused = rows.kept, rows.refused
    wants = [False] * count if call.has_initial_state is None else call.has_initial_state.tolist()
    history = x.new_zeros(count, width - 1, D, dtype=dtype)
    read = [n for n in range(count) if conv_states is not None and wants[n] and slots[n] >= 0]
    if read:
        rows = conv_states.detach().index_select(0, torch.tensor([slots[n] for n in read], device=x.device))
        history[read] = rows.transpose(1, 2).to(dtype)
    kept = [n for n in range(count) if lengths[n] > 0]  # the kernel's tiling rejects empty sequences
    y, finals = _Conv.apply(
        x.t().to(dtype).contiguous(),
        weight.t().to(dtype).contiguous(),
        None if bias is None else bias.to(dtype),
        history[kept],
        _Run(kernels, _bounds([lengths[n] for n in kept])),
    )
    out = _activate(y, activation).t().to(x.dtype)
    for n in refused:
        out[:, bounds[n] : bounds[n + 1]] = float("nan")
    write = [n for n in range(count) if slots[n] >= 0]
    if conv_states is not None and width > 1 and write:
        # an empty sequence's final state is its history
        everything = history.clone()
        everything[kept] = finals
        targets = torch.tensor([slots[n] for n in write], device=x.device)
        conv_states.index_copy_(0, targets, everything[write].transpose(1, 2).to(conv_states.dtype))
    return out


def make_causal_conv1d_fn(kernels: ConvKernels) -> Callable:
    def causal_conv1d_fn(call: ConvCall):
        return _dense(kernels, call) if call.query_start_loc is None else _varlen(kernels, call)

    return causal_conv1d_fn
