"""The public API as users import and call it: `gdn.__all__` and, for each public callable, its
parameters (name, kind, default). Annotations are left out: they document, a caller cannot bind to them."""

from __future__ import annotations

import inspect

import pytest

import gdn

P, K = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
_GDN_TAIL = [("scale", P, None), ("initial_state", P, None), ("output_final_state", P, False)]

SIGNATURES = {
    "PreparedPoolDecode": [
        *((name, P, inspect.Parameter.empty) for name in ("q", "k", "v", "g", "beta", "ssm_pool", "ssm_indices")),
        ("scale", P, None),
        ("cu_seqlens", P, None),
        ("use_qk_l2norm_in_kernel", P, False),
        ("state_v_first", K, False),
    ],
    "causal_conv1d_fn": [
        ("x", P, inspect.Parameter.empty),
        ("weight", P, inspect.Parameter.empty),
        ("bias", P, None),
        ("activation", K, None),
        ("seq_idx", K, None),
        ("initial_states", K, None),
        ("return_final_states", K, False),
        ("final_states_out", K, None),
        ("query_start_loc", K, None),
        ("conv_states", K, None),
        ("cache_indices", K, None),
        ("has_initial_state", K, None),
    ],
    "causal_conv1d_update": [
        ("x", P, inspect.Parameter.empty),
        ("conv_state", P, inspect.Parameter.empty),
        ("weight", P, inspect.Parameter.empty),
        ("bias", P, None),
        ("activation", P, None),
        ("conv_state_indices", K, None),
        ("cache_seqlens", K, None),
    ],
    "chunk_gated_delta_rule": [
        *((name, P, inspect.Parameter.empty) for name in ("q", "k", "v", "g", "beta")),
        *_GDN_TAIL,
        ("cu_seqlens", K, None),
        ("use_qk_l2norm_in_kernel", K, False),
        ("head_first", K, False),
        ("use_beta_sigmoid_in_kernel", K, False),
        ("allow_neg_eigval", K, False),
        ("state_v_first", K, False),
        ("cu_seqlens_cpu", K, None),
        ("chunk_indices", K, None),
        ("cp_context", K, None),
    ],
    "compute_mode": [],
    "fused_gdn_gating": [(name, P, inspect.Parameter.empty) for name in ("A_log", "a", "b", "dt_bias")],
    "fused_recurrent_gated_delta_rule": [
        *((name, P, inspect.Parameter.empty) for name in ("q", "k", "v", "g")),
        ("beta", K, inspect.Parameter.empty),
        *((name, K, default) for name, _, default in _GDN_TAIL),
        ("cu_seqlens", K, None),
        ("use_qk_l2norm_in_kernel", K, False),
        ("head_first", K, False),
        ("gk", K, None),
        ("gv", K, None),
        ("use_gate_in_kernel", K, False),
        ("A_log", K, None),
        ("dt_bias", K, None),
        ("use_beta_sigmoid_in_kernel", K, False),
        ("allow_neg_eigval", K, False),
        ("state_v_first", K, False),
    ],
    "fused_recurrent_gated_delta_rule_update": [
        *((name, P, inspect.Parameter.empty) for name in ("q", "k", "v", "g", "beta", "ssm_pool", "ssm_indices")),
        ("scale", P, None),
        ("cu_seqlens", P, None),
        ("use_qk_l2norm_in_kernel", P, False),
        ("state_v_first", K, False),
    ],
    "l2norm": [("x", P, inspect.Parameter.empty), ("eps", P, 1e-6)],
    "modes": [],
    "register_backend": [("backend", P, inspect.Parameter.empty), ("replace", K, False)],
    "resolutions": [],
    "set_compute_mode": [("mode", P, inspect.Parameter.empty)],
    "unregister_backend": [("name", P, inspect.Parameter.empty)],
}


@pytest.mark.probe
def test_the_exported_names_are_pinned():
    assert gdn.__all__ == ["GdnBackendError", *SIGNATURES]
    assert issubclass(gdn.GdnBackendError, Exception)


@pytest.mark.probe
@pytest.mark.parametrize("name", SIGNATURES)
def test_each_public_callable_keeps_its_parameters(name):
    parameters = inspect.signature(getattr(gdn, name)).parameters.values()
    found = [(p.name, p.kind.name, p.default) for p in parameters]
    assert found == [(n, kind, default) for n, kind, default in SIGNATURES[name]]
