"""The GDN call contract: the validation that turns a user's call, bound to its op's spec
(gdn.op_specs), into the typed call every backend implementation takes (one dataclass per op family:
GdnCall, PoolDecodeCall, ConvCall, ConvUpdateCall, L2NormCall, GatingCall). Layout follows
flash-linear-attention: q, k [B, T, H, K]; v [B, T, HV, V] with HV a multiple of H; g (log-space decay)
and beta [B, T, HV]; states [N, HV, K, V] in fp32. The public ops (gdn.ops) run these, then the backend
gdn.resolve chose."""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from gdn import _validate as check
from gdn._validate import GdnShapes
from gdn.op_specs import BY_NAME, OpSpec


class Call:
    """A validated call, as every backend implementation of its op takes it. Built once per user call
    and not changed afterwards (plain slots, not frozen: a decode step builds one per token)."""

    __slots__ = ()

    @property
    def device(self) -> torch.device:
        return getattr(self, _field_names(type(self))[0]).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the call's first input (q, x, A_log): the one that picks a kernel's variant."""
        return getattr(self, _field_names(type(self))[0]).dtype

    def tensors(self) -> Iterator[torch.Tensor]:
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                yield value

    def public_result(self, result):
        """A backend's result as the public op returns it (backends compute in the contract's layout)."""
        return result


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@dataclass(slots=True)
class _Tokens(Call):
    """What the gated-delta ops share: the token tensors, their validated shapes and the scale."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    shapes: GdnShapes
    scale: float

    # q read directly: every call reads its device and dtype, and these calls are the hot ones
    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype


@dataclass(slots=True)
class GdnCall(_Tokens):
    """chunk_gated_delta_rule and fused_recurrent_gated_delta_rule. initial_state is [N, HV, K, V]
    whatever the user's layout: with state_v_first it is the transposed view of the user's
    [N, HV, V, K] tensor, and the final state goes back to the user in that layout (a backend that
    writes it in that storage to begin with saves the copy)."""

    initial_state: torch.Tensor | None = None
    output_final_state: bool = False
    cu_seqlens: torch.Tensor | None = None
    use_qk_l2norm_in_kernel: bool = False
    state_v_first: bool = False

    def public_result(self, result):
        o, final = result
        if not self.state_v_first or final is None:
            return result
        return o, final.transpose(-1, -2).contiguous()


@dataclass(slots=True)
class PoolDecodeCall(_Tokens):
    """fused_recurrent_gated_delta_rule_update: sequence n reads and writes ssm_pool[ssm_indices[n]].
    ssm_pool is [slots, HV, K, V] whatever the user's layout: with state_v_first it is the transposed
    view of the user's [slots, HV, V, K] pool, written in place through that view."""

    ssm_pool: torch.Tensor
    ssm_indices: torch.Tensor
    cu_seqlens: torch.Tensor | None = None
    use_qk_l2norm_in_kernel: bool = False


@dataclass(slots=True)
class ConvCall(Call):
    """causal_conv1d_fn, dense (x [B, D, T]) or varlen (x [D, total_T] with query_start_loc)."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    activation: str | None = None
    seq_idx: torch.Tensor | None = None
    initial_states: torch.Tensor | None = None
    return_final_states: bool = False
    query_start_loc: torch.Tensor | None = None
    conv_states: torch.Tensor | None = None
    cache_indices: torch.Tensor | None = None
    has_initial_state: torch.Tensor | None = None


@dataclass(slots=True)
class ConvUpdateCall(Call):
    """causal_conv1d_update: conv_state rows (picked by conv_state_indices) updated in place."""

    x: torch.Tensor
    conv_state: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    activation: str | None = None
    conv_state_indices: torch.Tensor | None = None


@dataclass(slots=True)
class L2NormCall(Call):
    x: torch.Tensor
    eps: float = 1e-6


@dataclass(slots=True)
class GatingCall(Call):
    """fused_gdn_gating's four inputs."""

    A_log: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    dt_bias: torch.Tensor


# what a call binds each of its op's arguments to, in the spec's order (gdn.op_specs.OpSpec.bind)
Arguments = dict[str, Any]
PREPARE: dict[str, Callable[..., Call]] = {}


# validates a call's bound arguments (its op's spec, the arguments) and makes its call
Build = Callable[[OpSpec, Arguments], Call]


def define(spec: OpSpec, build: Build) -> Callable[..., Call]:
    """The op's prepare, registered in PREPARE: a call bound to its spec's arguments, its refused peer
    features checked, then `build` validates them and makes the call."""

    def prepare(*args: Any, **kwargs: Any) -> Call:
        arguments = spec.bind(args, kwargs)
        if len(arguments) != spec.kept:
            _refuse_features(spec, arguments)
        return build(spec, arguments)

    functools.update_wrapper(prepare, build)
    prepare.__name__ = prepare.__qualname__ = spec.name
    prepare.__signature__ = spec.signature()  # type: ignore[attr-defined]
    PREPARE[spec.name] = prepare
    return prepare


def _op(build: Build) -> Callable[..., Call]:
    """A built-in op's prepare, from its build named like the op."""
    return define(BY_NAME[build.__name__], build)


def _refuse_features(spec: OpSpec, arguments: Arguments) -> None:
    """The refused peer features a call names (OpSpec.bind), in the spec's order: each passes at its
    default and leaves the arguments; anything else is refused by name."""
    for arg in spec.refused:
        value = arguments.pop(arg.name, arg.default)
        if value is not arg.default:
            check.Checker(spec.name).unsupported(arg.name, value, arg.default, arg.refused)


def _dense(spec: OpSpec, arguments: Arguments) -> Arguments:
    """The small tensors (offsets, slot indices, flags, bias, conv weight, gate parameters) are read by
    the kernels as dense buffers without strides; one copy here serves every backend. The large
    operands and the state pools keep their strides: the kernels take those, and a pool is written in
    place."""
    for name in spec.dense:
        t = arguments[name]
        if t is not None:
            arguments[name] = t.contiguous()
    return arguments


def _made(cls: type[Call], arguments: Arguments) -> Call:
    """The call of type `cls` from the validated arguments (the call's own binding, free to change),
    to which validation added the fields it computed."""
    return cls(*_fields_of(cls)(arguments))


@functools.cache
def _fields_of(cls: type) -> Callable[[Arguments], tuple]:
    """A call type's fields, in its order, out of the arguments (one C call: every op call makes one)."""
    names = _field_names(cls)
    getter = operator.itemgetter(*names)
    return getter if len(names) > 1 else lambda arguments: (getter(arguments),)


def _key_first(state: torch.Tensor | None, state_v_first: bool) -> torch.Tensor | None:
    """A state in the contract's [.., K, V] layout: a [.., V, K] one (state_v_first) as its transposed
    view, no copy (the kernels take strides, and a pool is written in place through the view)."""
    return state.transpose(-1, -2) if state_v_first and state is not None else state


def _gdn_call(spec: OpSpec, arguments: Arguments) -> GdnCall:
    """The shared contract of the chunk and recurrent ops, validated."""
    arguments["shapes"], arguments["scale"] = check.check_gdn_inputs(spec.name, arguments)
    arguments = _dense(spec, arguments)
    arguments["initial_state"] = _key_first(arguments["initial_state"], arguments["state_v_first"])
    return _made(GdnCall, arguments)


@_op
def chunk_gated_delta_rule(spec: OpSpec, arguments: Arguments) -> GdnCall:
    """Chunked gated delta rule (training and prefill). Returns (o [B, T, HV, V], final_state | None).

    scale defaults to K**-0.5; with cu_seqlens [N + 1] the N sequences are packed along T (B = 1);
    initial_state and the final state are [N, HV, K, V] fp32 ([N, HV, V, K] with state_v_first, fla's
    value-first layout); differentiable in q, k, v, g, beta and initial_state. The positions are fla's
    up to output_final_state; the rest are keyword-only. fla's arguments for features gdn lacks are
    refused (TypeError) unless they hold their defaults."""
    return _gdn_call(spec, arguments)


@_op
def fused_recurrent_gated_delta_rule(spec: OpSpec, arguments: Arguments) -> GdnCall:
    """The same contract as chunk_gated_delta_rule, computed token by token (decode). fla puts gk and
    gv at positions 5-6, so beta and everything after g are keyword-only; fla's arguments for features
    gdn lacks are refused (TypeError) unless they hold their defaults."""
    return _gdn_call(spec, arguments)


@_op
def fused_recurrent_gated_delta_rule_update(spec: OpSpec, arguments: Arguments) -> PoolDecodeCall:
    """Decode against a state pool: sequence n reads and writes ssm_pool[ssm_indices[n]] in place
    (ssm_pool [max_slots, HV, K, V], or [max_slots, HV, V, K] with state_v_first, in fp32, bf16 or
    fp16: the recurrence runs in fp32 and the state is rounded to the pool's dtype when written back,
    so a half-precision pool halves the state traffic). Index -1 skips the sequence: its output is zero
    and the pool is untouched. Returns o [B, T, HV, V]."""
    arguments["shapes"], arguments["scale"] = check.check_pool_decode_inputs(spec.name, arguments)
    arguments = _dense(spec, arguments)
    arguments["ssm_pool"] = _key_first(arguments["ssm_pool"], arguments["state_v_first"])
    return _made(PoolDecodeCall, arguments)


@_op
def causal_conv1d_fn(spec: OpSpec, arguments: Arguments) -> ConvCall:
    """Depthwise causal conv1d for prefill (call-compatible with causal-conv1d and transformers).

    Dense: x [B, D, T], weight [D, W]; optional seq_idx [B, T] (packed sequences never mix) and
    initial_states [B, D, W - 1]; returns out [B, D, T], or (out, final_states) with
    return_final_states. Varlen: x [D, total_T] with query_start_loc [N + 1]; conv_states
    [slots, D, W - 1] is a pool read where has_initial_state [N] is set and written with each sequence's
    last W - 1 inputs at cache_indices [N] (default 0..N-1; -1 skips). Only x, weight and bias are
    positional: causal-conv1d's releases put seq_idx or activation at position 4."""
    check.check_conv_fn_inputs(spec.name, arguments)
    return _made(ConvCall, _dense(spec, arguments))


@_op
def causal_conv1d_update(spec: OpSpec, arguments: Arguments) -> ConvUpdateCall:
    """Decode step: x [B, D] or [B, D, L] new tokens; conv_state [slots, D, state_len >= W - 1] is
    updated in place (rows picked by conv_state_indices [B], -1 skips a row). causal-conv1d's
    position 6 is cache_seqlens (a circular state buffer, which gdn lacks and refuses), so
    conv_state_indices is keyword-only."""
    check.check_conv_update_inputs(spec.name, arguments)
    return _made(ConvUpdateCall, _dense(spec, arguments))


@_op
def l2norm(spec: OpSpec, arguments: Arguments) -> L2NormCall:
    """x / sqrt(sum(x^2, -1) + eps), computed in fp32, returned in x's dtype."""
    check.check_l2norm_inputs(spec.name, arguments)
    return L2NormCall(arguments["x"], float(arguments["eps"]))


@_op
def fused_gdn_gating(spec: OpSpec, arguments: Arguments) -> GatingCall:
    """g = -exp(A_log) * softplus(a + dt_bias) (fp32) and beta = sigmoid(b) (b's dtype)."""
    check.check_gating_inputs(spec.name, arguments)
    return _made(GatingCall, _dense(spec, arguments))
