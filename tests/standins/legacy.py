"""The stand-in legacy extension: fla_npu's ops registered as torch.ops.npu.* with the dispatcher
schemas of fla_npu 26.6 (npu_custom.yaml), so that calls are checked the way the real dispatcher
checks them (argument names, keyword-only arguments, int[] host lists, optional tensors).

Dispatcher ops return tensors where the Python ops return None (an undefined tensor comes back as
None from C++, never from a Python kernel), so empty tensors stand in for them here.
"""

from __future__ import annotations

import torch

from standins import _checks as check
from standins import kernels_chunk as chunk
from standins import kernels_conv as conv

SCHEMAS = {
    "npu_causal_conv1d": (
        "npu_causal_conv1d(Tensor x, Tensor weight, Tensor? bias, Tensor conv_states, *, int[]? query_start_loc=None, "
        "int[]? cache_indices=None, int[]? initial_state_mode=None, int[]? num_accepted_tokens=None, "
        "int activation_mode=0, int pad_slot_id=-1, int run_mode=0, int head_num=0) -> Tensor"
    ),
    "npu_causal_conv1d_bwd": (
        "npu_causal_conv1d_bwd(Tensor x, Tensor? y, Tensor weight, Tensor dy, Tensor? initial_state=None, "
        'Tensor? dht=None, *, int[]? query_start_loc=None, int activation=0, str input_layout="BSND") '
        "-> (Tensor dx, Tensor dw, Tensor db, Tensor dh0)"
    ),
    "npu_prepare_wy_repr_bwd_full": (
        "npu_prepare_wy_repr_bwd_full(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor dA, Tensor dw, Tensor du, "
        "Tensor g, int chunk_size, *, int[]? cu_seqlens=None, int[]? chunk_indices=None) "
        "-> (Tensor dk, Tensor dv, Tensor dbeta, Tensor dg)"
    ),
    "npu_chunk_gated_delta_rule_bwd_dhu": (
        "npu_chunk_gated_delta_rule_bwd_dhu(Tensor q, Tensor k, Tensor w, Tensor d_o, Tensor dv, float scale, "
        "int chunk_size, *, Tensor? g=None, Tensor? gK=None, Tensor? h0=None, Tensor? dht=None, "
        "int[]? cu_seqlens=None, int[]? chunk_indices=None, bool? use_exp2=False, "
        "bool? transpose_state_layout=False) -> (Tensor, Tensor, Tensor)"
    ),
    "npu_chunk_bwd_dv_local": (
        "npu_chunk_bwd_dv_local(Tensor q, Tensor k, Tensor d_o, Tensor g, float scale, int chunk_size, *, "
        "Tensor? g_gamma=None, Tensor? A=None, int[]? cu_seqlens=None, int[]? chunk_indices=None) -> Tensor"
    ),
    "npu_prepare_wy_repr_bwd_da": (
        "npu_prepare_wy_repr_bwd_da(Tensor k, Tensor v, Tensor beta, Tensor A, Tensor dw, Tensor du, Tensor g, *, "
        "int chunk_size, int[]? cu_seqlens=None, int[]? chunk_indices=None) -> Tensor"
    ),
    "npu_chunk_bwd_dqkwg": (
        "npu_chunk_bwd_dqkwg(Tensor q, Tensor k, Tensor v, Tensor g, Tensor h, Tensor dox, Tensor dh, Tensor dv, "
        "int chunk_size, *, int[]? cu_seqlens=None, int[]? chunk_indices=None, Tensor? w=None, "
        "Tensor? g_gamma=None, float? scale=None, bool? use_exp2=None, bool? transpose_state_layout=None) "
        "-> (Tensor, Tensor, Tensor, Tensor)"
    ),
    "npu_chunk_fwd_o": (
        "npu_chunk_fwd_o(Tensor q, Tensor k, Tensor v, Tensor h, float scale, *, Tensor? g=None, "
        "Tensor? g_gamma=None, int[]? cu_seqlens=None, int[]? chunk_indices=None, int? chunk_size=None, "
        "bool? transpose_state_layout=False) -> Tensor"
    ),
    "npu_chunk_gated_delta_rule_fwd_h": (
        "npu_chunk_gated_delta_rule_fwd_h(Tensor k, Tensor w, Tensor u, Tensor? g=None, *, Tensor? gk=None, "
        "Tensor? initial_state=None, bool? output_final_state=False, int? chunk_size=None, "
        "bool? save_new_value=True, int[]? cu_seqlens=None, int[]? chunk_indices=None, bool? use_exp2=False, "
        "bool? transpose_state_layout=False) -> (Tensor, Tensor, Tensor)"
    ),
    "npu_recompute_w_u_fwd": (
        "npu_recompute_w_u_fwd(Tensor k, Tensor v, Tensor beta, Tensor A, int chunk_size, *, Tensor? g=None, "
        "Tensor? gk=None, int[]? cu_seqlens=None, int[]? chunk_indices=None) -> (Tensor, Tensor)"
    ),
}


def _defined(*outputs):
    return tuple(torch.empty(0) if t is None else t for t in outputs)


def _fwd_h(k, w, u, g=None, *, save_new_value=True, use_exp2=False, transpose_state_layout=False, **kwargs):
    op = "torch.ops.npu.npu_chunk_gated_delta_rule_fwd_h"
    check.not_modelled(op, use_exp2=use_exp2, transpose_state_layout=transpose_state_layout)
    if save_new_value is False:
        raise NotImplementedError(f"{op} stand-in: save_new_value=False is not modelled")
    return _defined(*chunk.npu_chunk_gated_delta_rule_fwd_h(k, w, u, g, **kwargs))


def _dhu(*args, **kwargs):
    return _defined(*chunk.npu_chunk_gated_delta_rule_bwd_dhu(*args, **kwargs))


KERNELS = {
    "npu_causal_conv1d": conv.npu_causal_conv1d,
    "npu_causal_conv1d_bwd": conv.npu_causal_conv1d_bwd,
    "npu_prepare_wy_repr_bwd_full": chunk.npu_prepare_wy_repr_bwd_full,
    "npu_chunk_gated_delta_rule_bwd_dhu": _dhu,
    "npu_chunk_bwd_dv_local": chunk.npu_chunk_bwd_dv_local,
    "npu_prepare_wy_repr_bwd_da": chunk.npu_prepare_wy_repr_bwd_da,
    "npu_chunk_bwd_dqkwg": chunk.npu_chunk_bwd_dqkwg,
    "npu_chunk_fwd_o": chunk.npu_chunk_fwd_o,
    "npu_chunk_gated_delta_rule_fwd_h": _fwd_h,
    "npu_recompute_w_u_fwd": chunk.npu_recompute_w_u_fwd,
}

_library: torch.library.Library | None = None  # the registrations live as long as this object


def register() -> None:
    global _library
    if _library is not None:
        return
    library = torch.library.Library("npu", "FRAGMENT")
    for name, schema in SCHEMAS.items():
        library.define(schema)
        library.impl(name, KERNELS[name], "CompositeExplicitAutograd")
    _library = library
