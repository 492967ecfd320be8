"""The GDN call contract: each op's signature and the validation that turns a user's call into the
typed call every backend implementation takes (one dataclass per op family: GdnCall, PoolDecodeCall,
ConvCall, ConvUpdateCall, L2NormCall, GatingCall). Layout follows flash-linear-attention: q, k
[B, T, H, K]; v [B, T, HV, V] with HV a multiple of H; g (log-space decay) and beta [B, T, HV]; states
[N, HV, K, V] in fp32. The public ops (gdn.ops) run these, then the backend gdn.resolve chose."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from gdn import _validate as check
from gdn._validate import GdnShapes


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


PREPARE: dict[str, Callable[..., Call]] = {}


def _dense(t: torch.Tensor | None) -> torch.Tensor | None:
    """The small tensors (offsets, slot indices, flags, bias, conv weight, gate parameters) are read by
    the kernels as dense buffers without strides; one copy here serves every backend. The large
    operands and the state pools keep their strides: the kernels take those, and a pool is written in
    place."""
    return None if t is None else t.contiguous()


# The libraries gdn is a drop-in for, and what they bind at the first position gdn does not share
# with them. gdn takes every later argument by keyword only, so a call written for the peer never
# binds a value to a different parameter: an extra positional argument is refused by that name.
PEER_POSITIONAL: dict[str, tuple[str, str]] = {
    "chunk_gated_delta_rule": ("fla", "use_qk_l2norm_in_kernel"),
    "fused_recurrent_gated_delta_rule": ("fla", "gk"),
    "causal_conv1d_fn": ("causal-conv1d", "seq_idx"),
    "causal_conv1d_update": ("causal-conv1d", "cache_seqlens"),
}


def positional_names(prepare: Callable) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(prepare).parameters.values() if p.kind in kinds]


def refuse_extra_positionals(op: str, given: int, positional: list[str]) -> None:
    """A call written for the peer that passes more positional arguments than gdn shares with it is
    refused by the name the peer gives the first extra one."""
    if given <= len(positional) or op not in PEER_POSITIONAL:
        return
    peer, name = PEER_POSITIONAL[op]
    raise TypeError(
        f"{op}: argument {len(positional) + 1} ('{name}' in {peer}) must be passed by keyword: gdn takes "
        f"only {', '.join(positional)} by position"
    )


def _op(prepare: Callable[..., Call]) -> Callable[..., Call]:
    PREPARE[prepare.__name__] = prepare
    return prepare


def _refuse_fla_features(op: str, use_beta_sigmoid_in_kernel: object, allow_neg_eigval: object) -> check.Checker:
    c = check.Checker(op)
    c.unsupported("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel, False, "beta = sigmoid(beta) in the kernel")
    c.unsupported("allow_neg_eigval", allow_neg_eigval, False, "beta scaled to (0, 2)")
    return c


def _key_first(state: torch.Tensor | None, state_v_first: bool) -> torch.Tensor | None:
    """A state in the contract's [.., K, V] layout: a [.., V, K] one (state_v_first) as its transposed
    view, no copy (the kernels take strides, and a pool is written in place through the view)."""
    return state.transpose(-1, -2) if state_v_first and state is not None else state


def _gdn_call(
    op,
    q,
    k,
    v,
    g,
    beta,
    scale,
    initial_state,
    output_final_state,
    cu_seqlens,
    use_qk_l2norm_in_kernel,
    head_first,
    state_v_first,
) -> GdnCall:
    """The shared contract of the chunk and recurrent ops, validated."""
    shapes, scale = check.check_gdn_inputs(
        op, q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel, head_first, state_v_first
    )
    check.Checker(op).flag("output_final_state", output_final_state)
    return GdnCall(
        q,
        k,
        v,
        g,
        beta,
        shapes,
        scale,
        _key_first(initial_state, state_v_first),
        output_final_state,
        _dense(cu_seqlens),
        use_qk_l2norm_in_kernel,
        state_v_first,
    )


@_op
def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    head_first: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens_cpu: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    cp_context: object = None,
):
    """Chunked gated delta rule (training and prefill). Returns (o [B, T, HV, V], final_state | None).

    scale defaults to K**-0.5; with cu_seqlens [N + 1] the N sequences are packed along T (B = 1);
    initial_state and the final state are [N, HV, K, V] fp32 ([N, HV, V, K] with state_v_first, fla's
    value-first layout); differentiable in q, k, v, g, beta and initial_state. The positions are fla's
    up to output_final_state; the rest are keyword-only. fla's arguments for features gdn lacks are
    refused (TypeError) unless they hold their defaults."""
    c = _refuse_fla_features("chunk_gated_delta_rule", use_beta_sigmoid_in_kernel, allow_neg_eigval)
    c.unsupported("cu_seqlens_cpu", cu_seqlens_cpu, None, "a host copy of cu_seqlens; pass cu_seqlens only")
    c.unsupported("chunk_indices", chunk_indices, None, "precomputed chunk indices; they follow from cu_seqlens")
    c.unsupported("cp_context", cp_context, None, "context parallelism")
    return _gdn_call(
        "chunk_gated_delta_rule",
        q,
        k,
        v,
        g,
        beta,
        scale,
        initial_state,
        output_final_state,
        cu_seqlens,
        use_qk_l2norm_in_kernel,
        head_first,
        state_v_first,
    )


@_op
def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    *,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    head_first: bool = False,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
):
    """The same contract as chunk_gated_delta_rule, computed token by token (decode). fla puts gk and
    gv at positions 5-6, so beta and everything after g are keyword-only; fla's arguments for features
    gdn lacks are refused (TypeError) unless they hold their defaults."""
    op = "fused_recurrent_gated_delta_rule"
    c = _refuse_fla_features(op, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    c.unsupported("gk", gk, None, "a per-key gate")
    c.unsupported("gv", gv, None, "a per-value gate")
    c.unsupported(
        "use_gate_in_kernel",
        use_gate_in_kernel,
        False,
        "the gate computed in the kernel (gdn.fused_gdn_gating computes g)",
    )
    c.unsupported("A_log", A_log, None, "the gate computed in the kernel (gdn.fused_gdn_gating takes A_log)")
    c.unsupported("dt_bias", dt_bias, None, "the gate computed in the kernel (gdn.fused_gdn_gating takes dt_bias)")
    return _gdn_call(
        op,
        q,
        k,
        v,
        g,
        beta,
        scale,
        initial_state,
        output_final_state,
        cu_seqlens,
        use_qk_l2norm_in_kernel,
        head_first,
        state_v_first,
    )


@_op
def fused_recurrent_gated_delta_rule_update(
    q,
    k,
    v,
    g,
    beta,
    ssm_pool,
    ssm_indices,
    scale=None,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=False,
    *,
    state_v_first=False,
):
    """Decode against a state pool: sequence n reads and writes ssm_pool[ssm_indices[n]] in place
    (ssm_pool [max_slots, HV, K, V], or [max_slots, HV, V, K] with state_v_first, in fp32, bf16 or
    fp16: the recurrence runs in fp32 and the state is rounded to the pool's dtype when written back,
    so a half-precision pool halves the state traffic). Index -1 skips the sequence: its output is zero
    and the pool is untouched. Returns o [B, T, HV, V]."""
    shapes, scale = check.check_pool_decode_inputs(
        "fused_recurrent_gated_delta_rule_update",
        q,
        k,
        v,
        g,
        beta,
        ssm_pool,
        ssm_indices,
        scale,
        cu_seqlens,
        use_qk_l2norm_in_kernel,
        state_v_first,
    )
    return PoolDecodeCall(
        q,
        k,
        v,
        g,
        beta,
        shapes,
        scale,
        _key_first(ssm_pool, state_v_first),
        _dense(ssm_indices),
        _dense(cu_seqlens),
        use_qk_l2norm_in_kernel,
    )


@_op
def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    query_start_loc: torch.Tensor | None = None,
    conv_states: torch.Tensor | None = None,
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
):
    """Depthwise causal conv1d for prefill (call-compatible with causal-conv1d and transformers).

    Dense: x [B, D, T], weight [D, W]; optional seq_idx [B, T] (packed sequences never mix) and
    initial_states [B, D, W - 1]; returns out [B, D, T], or (out, final_states) with
    return_final_states. Varlen: x [D, total_T] with query_start_loc [N + 1]; conv_states
    [slots, D, W - 1] is a pool read where has_initial_state [N] is set and written with each sequence's
    last W - 1 inputs at cache_indices [N] (default 0..N-1; -1 skips). Only x, weight and bias are
    positional: causal-conv1d's releases put seq_idx or activation at position 4."""
    check.Checker("causal_conv1d_fn").unsupported(
        "final_states_out", final_states_out, None, "a preallocated final-state output"
    )
    check.check_conv_fn_inputs(
        x,
        weight,
        bias,
        activation,
        seq_idx,
        initial_states,
        return_final_states,
        query_start_loc,
        conv_states,
        cache_indices,
        has_initial_state,
    )
    return ConvCall(
        x,
        _dense(weight),
        _dense(bias),
        activation,
        seq_idx=_dense(seq_idx),
        initial_states=initial_states,
        return_final_states=return_final_states,
        query_start_loc=_dense(query_start_loc),
        conv_states=conv_states,
        cache_indices=_dense(cache_indices),
        has_initial_state=_dense(has_initial_state),
    )


@_op
def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    conv_state_indices: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | None = None,
):
    """Decode step: x [B, D] or [B, D, L] new tokens; conv_state [slots, D, state_len >= W - 1] is
    updated in place (rows picked by conv_state_indices [B], -1 skips a row). causal-conv1d's
    position 6 is cache_seqlens (a circular state buffer, which gdn lacks and refuses), so
    conv_state_indices is keyword-only."""
    check.Checker("causal_conv1d_update").unsupported(
        "cache_seqlens", cache_seqlens, None, "a circular conv-state buffer"
    )
    check.check_conv_update_inputs(x, conv_state, weight, bias, activation, conv_state_indices)
    return ConvUpdateCall(x, conv_state, _dense(weight), _dense(bias), activation, _dense(conv_state_indices))


@_op
def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2, -1) + eps), computed in fp32, returned in x's dtype."""
    check.check_l2norm_inputs(x, eps)
    return L2NormCall(x, float(eps))


@_op
def fused_gdn_gating(A_log, a, b, dt_bias):
    """g = -exp(A_log) * softplus(a + dt_bias) (fp32) and beta = sigmoid(b) (b's dtype)."""
    check.check_gating_inputs(A_log, a, b, dt_bias)
    return GatingCall(_dense(A_log), a, b, _dense(dt_bias))
