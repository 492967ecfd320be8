"""The GDN op contract. Each op validates its inputs, then runs the backend that `gdn.resolve`
chose for (op, device). Layout follows flash-linear-attention: q, k [B, T, H, K]; v [B, T, HV, V]
with HV a multiple of H; g (log-space decay) and beta [B, T, HV]; states [N, HV, K, V] in fp32."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gdn import _validate as check
from gdn.resolve import for_call, resolve


@dataclass
class Call:
    """A validated call, in the form every backend implementation takes."""

    device: torch.device
    args: tuple
    kwargs: dict[str, Any] = field(default_factory=dict)


PREPARE: dict[str, Callable[..., Call]] = {}


def _dense(t: torch.Tensor | None) -> torch.Tensor | None:
    """The small tensors (offsets, slot indices, flags, bias, conv weight, gate parameters) are read by
    the kernels as dense buffers without strides; one copy here serves every backend. The large
    operands and the state pools keep their strides: the kernels take those, and a pool is written in
    place."""
    return None if t is None else t.contiguous()


def _op(prepare: Callable[..., Call]) -> Callable:
    name = prepare.__name__
    PREPARE[name] = prepare

    @functools.wraps(prepare)
    def run(*args, **kwargs):
        call = prepare(*args, **kwargs)
        return for_call(resolve(name, call.device), call)(*call.args, **call.kwargs)

    return run


def _gdn_call(
    op, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel, head_first
) -> Call:
    """The shared contract of the chunk and recurrent ops, validated."""
    shapes, scale = check.check_gdn_inputs(
        op, q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel, head_first
    )
    check.Checker(op).flag("output_final_state", output_final_state)
    kwargs = dict(
        shapes=shapes,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=_dense(cu_seqlens),
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
    return Call(q.device, (q, k, v, g, beta), kwargs)


@_op
def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=False,
    head_first=False,
):
    """Chunked gated delta rule (training and prefill). Returns (o [B, T, HV, V], final_state | None).

    scale defaults to K**-0.5; with cu_seqlens [N + 1] the N sequences are packed along T (B = 1);
    initial_state and the final state are [N, HV, K, V] fp32; differentiable in q, k, v, g, beta and
    initial_state."""
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
    )


@_op
def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=False,
    head_first=False,
):
    """The same contract as chunk_gated_delta_rule, computed token by token (decode)."""
    return _gdn_call(
        "fused_recurrent_gated_delta_rule",
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
    )


@_op
def fused_recurrent_gated_delta_rule_update(
    q, k, v, g, beta, ssm_pool, ssm_indices, scale=None, cu_seqlens=None, use_qk_l2norm_in_kernel=False
):
    """Decode against a state pool: sequence n reads and writes ssm_pool[ssm_indices[n]] in place
    (ssm_pool [max_slots, HV, K, V] fp32). Index -1 skips the sequence: its output is zero and the pool
    is untouched. Returns o [B, T, HV, V]."""
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
    )
    return Call(
        q.device,
        (q, k, v, g, beta),
        dict(
            shapes=shapes,
            scale=scale,
            ssm_pool=ssm_pool,
            ssm_indices=_dense(ssm_indices),
            cu_seqlens=_dense(cu_seqlens),
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        ),
    )


@_op
def causal_conv1d_fn(
    x,
    weight,
    bias=None,
    activation=None,
    seq_idx=None,
    initial_states=None,
    return_final_states=False,
    *,
    query_start_loc=None,
    conv_states=None,
    cache_indices=None,
    has_initial_state=None,
):
    """Depthwise causal conv1d for prefill (call-compatible with causal-conv1d and transformers).

    Dense: x [B, D, T], weight [D, W]; optional seq_idx [B, T] (packed sequences never mix) and
    initial_states [B, D, W - 1]; returns out [B, D, T], or (out, final_states) with
    return_final_states. Varlen: x [D, total_T] with query_start_loc [N + 1]; conv_states
    [slots, D, W - 1] is a pool read where has_initial_state [N] is set and written with each sequence's
    last W - 1 inputs at cache_indices [N] (default 0..N-1; -1 skips)."""
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
    return Call(
        x.device,
        (x, _dense(weight), _dense(bias), activation),
        dict(
            seq_idx=_dense(seq_idx),
            initial_states=initial_states,
            return_final_states=return_final_states,
            query_start_loc=_dense(query_start_loc),
            conv_states=conv_states,
            cache_indices=_dense(cache_indices),
            has_initial_state=_dense(has_initial_state),
        ),
    )


@_op
def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None):
    """Decode step: x [B, D] or [B, D, L] new tokens; conv_state [slots, D, state_len >= W - 1] is
    updated in place (rows picked by conv_state_indices [B], -1 skips a row)."""
    check.check_conv_update_inputs(x, conv_state, weight, bias, activation, conv_state_indices)
    return Call(
        x.device,
        (x, conv_state, _dense(weight), _dense(bias), activation),
        dict(conv_state_indices=_dense(conv_state_indices)),
    )


@_op
def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2, -1) + eps), computed in fp32, returned in x's dtype."""
    check.check_l2norm_inputs(x, eps)
    return Call(x.device, (x,), dict(eps=float(eps)))


@_op
def fused_gdn_gating(A_log, a, b, dt_bias):
    """g = -exp(A_log) * softplus(a + dt_bias) (fp32) and beta = sigmoid(b) (b's dtype)."""
    check.check_gating_inputs(A_log, a, b, dt_bias)
    return Call(a.device, (_dense(A_log), a, b, _dense(dt_bias)))
