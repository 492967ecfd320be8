"""The ops' specs (gdn.op_specs) and what is derived from them: the custom ops' schemas as torch
registered them (pinned as they were when each op's arguments were written out by hand), the binding
of a call to its arguments, and the fakes a compiled graph lays its outputs out by."""

from __future__ import annotations

import compileall
import shutil
import subprocess
import sys

import pytest
import torch

import gdn
from gdn import library
from gdn.calls import SPECS
from gdn.op_specs import BY_NAME
from repo_paths import SRC

pytestmark = pytest.mark.probe

REGISTERED = [
    (
        "gdn::chunk_gated_delta_rule(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float? scale, "
        "Tensor? initial_state, bool output_final_state, Tensor? cu_seqlens, bool use_qk_l2norm_in_kernel, "
        "bool state_v_first) -> (Tensor, Tensor)"
    ),
    (
        "gdn::fused_recurrent_gated_delta_rule(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
        "float? scale, Tensor? initial_state, bool output_final_state, Tensor? cu_seqlens, "
        "bool use_qk_l2norm_in_kernel, bool state_v_first) -> (Tensor, Tensor)"
    ),
    (
        "gdn::fused_recurrent_gated_delta_rule_update(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
        "Tensor(a!) ssm_pool, Tensor ssm_indices, float? scale, Tensor? cu_seqlens, "
        "bool use_qk_l2norm_in_kernel, bool state_v_first) -> Tensor"
    ),
    (
        "gdn::causal_conv1d_fn(Tensor x, Tensor weight, Tensor? bias, str? activation, Tensor? seq_idx, "
        "Tensor? initial_states, bool return_final_states) -> (Tensor, Tensor)"
    ),
    (
        "gdn::causal_conv1d_fn_varlen(Tensor x, Tensor weight, Tensor? bias, str? activation, "
        "Tensor query_start_loc, Tensor(a!)? conv_states, Tensor? cache_indices, "
        "Tensor? has_initial_state) -> Tensor"
    ),
    (
        "gdn::causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, "
        "str? activation, Tensor? conv_state_indices) -> Tensor"
    ),
    "gdn::l2norm(Tensor x, float eps) -> Tensor",
    "gdn::fused_gdn_gating(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)",
    (
        "gdn::chunk_gated_delta_rule_backward(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
        "float? scale, Tensor? initial_state, bool output_final_state, Tensor? cu_seqlens, "
        "bool use_qk_l2norm_in_kernel, bool state_v_first, Tensor[] grads) -> Tensor[]"
    ),
    (
        "gdn::fused_recurrent_gated_delta_rule_backward(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
        "float? scale, Tensor? initial_state, bool output_final_state, Tensor? cu_seqlens, "
        "bool use_qk_l2norm_in_kernel, bool state_v_first, Tensor[] grads) -> Tensor[]"
    ),
    (
        "gdn::causal_conv1d_fn_backward(Tensor x, Tensor weight, Tensor? bias, str? activation, "
        "Tensor? seq_idx, Tensor? initial_states, bool return_final_states, Tensor[] grads) -> Tensor[]"
    ),
    "gdn::l2norm_backward(Tensor x, float eps, Tensor[] grads) -> Tensor[]",
    ("gdn::fused_gdn_gating_backward(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias, Tensor[] grads) -> Tensor[]"),
]


def test_the_custom_ops_are_registered_with_their_schemas():
    names = [op.name for op in library.OPS] + [f"{op.name}_backward" for op in library.OPS if op.grads]
    found = [str(getattr(torch.ops.gdn, name).default._schema) for name in names]
    assert found == REGISTERED


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_each_public_op_has_its_specs_signature(spec):
    import inspect

    assert inspect.signature(getattr(gdn, spec.name)) == spec.signature()
    assert getattr(gdn, spec.name).__name__ == spec.name


def test_a_call_binds_in_the_specs_order_with_defaults():
    spec = BY_NAME["fused_recurrent_gated_delta_rule_update"]
    q, k, v, g, beta, pool, indices = (object() for _ in range(7))
    by_keyword = spec.bind((q,), {"ssm_indices": indices, "beta": beta, "g": g, "v": v, "k": k, "ssm_pool": pool})
    assert list(by_keyword) == list(spec.names)
    assert by_keyword == spec.bind((q, k, v, g, beta, pool, indices), {})
    assert by_keyword["scale"] is None and by_keyword["state_v_first"] is False


@pytest.mark.parametrize(
    ("op", "args", "kwargs", "message"),
    [
        ("l2norm", (1, 2, 3), {}, r"^l2norm\(\) takes from 1 to 2 positional arguments but 3 were given$"),
        ("l2norm", (1,), {"epsilon": 2}, r"^l2norm\(\) got an unexpected keyword argument 'epsilon'$"),
        ("l2norm", (1,), {"x": 2}, r"^l2norm\(\) got multiple values for argument 'x'$"),
        ("l2norm", (), {"eps": 2}, r"^l2norm\(\) missing 1 required positional argument: 'x'$"),
        (
            "fused_gdn_gating",
            (1, 2, 3, 4, 5),
            {},
            r"^fused_gdn_gating\(\) takes 4 positional arguments but 5 were given$",
        ),
        (
            "fused_gdn_gating",
            (1,),
            {},
            r"^fused_gdn_gating\(\) missing 3 required positional arguments: 'a', 'b', and 'dt_bias'$",
        ),
        (
            "fused_gdn_gating",
            (1, 2),
            {},
            r"^fused_gdn_gating\(\) missing 2 required positional arguments: 'b' and 'dt_bias'$",
        ),
        (
            "fused_recurrent_gated_delta_rule",
            (1, 2, 3, 4),
            {},
            r"^fused_recurrent_gated_delta_rule\(\) missing 1 required keyword-only argument: 'beta'$",
        ),
    ],
)
def test_a_call_its_signature_cannot_bind_raises_pythons_type_error(op, args, kwargs, message):
    """The TypeError, word for word, that Python raised when the ops' signatures were written as defs."""
    with pytest.raises(TypeError, match=message):
        BY_NAME[op].bind(args, kwargs)
    with pytest.raises(TypeError, match=message):
        getattr(gdn, op)(*args, **kwargs)


def test_too_many_positionals_beside_a_keyword_raise_pythons_own_words():
    """Python counts the keyword-only arguments given in this message; the op's binding is Python's."""
    message = (
        r"^fused_recurrent_gated_delta_rule_update\(\) takes from 7 to 10 positional arguments but 11 positional "
        r"arguments \(and 1 keyword-only argument\) were given$"
    )
    with pytest.raises(TypeError, match=message):
        BY_NAME["fused_recurrent_gated_delta_rule_update"].bind(tuple(range(11)), {"state_v_first": True})


def test_a_refused_feature_is_bound_only_where_it_is_not_at_its_default():
    """Validation keys its accepted calls by the bound arguments: a refused peer feature at its default
    (it cannot be anything else once the call is accepted) is not among them."""
    spec = BY_NAME["chunk_gated_delta_rule"]
    kept = [a.name for a in spec.args if a.refused is None]
    assert list(spec.bind((1, 2, 3, 4, 5), {})) == kept
    assert list(spec.bind((1, 2, 3, 4, 5), {"cp_context": None, "allow_neg_eigval": False})) == kept
    context = object()
    bound = spec.bind((1, 2, 3, 4, 5), {"cp_context": context, "allow_neg_eigval": 0})
    assert list(bound) == [*kept, "allow_neg_eigval", "cp_context"] and bound["cp_context"] is context
    with pytest.raises(TypeError, match=r"argument 'allow_neg_eigval' expected False \(gdn does not implement"):
        gdn.chunk_gated_delta_rule(1, 2, 3, 4, 5, allow_neg_eigval=0)


def test_an_extra_positional_of_a_peers_call_is_refused_by_the_peers_name():
    with pytest.raises(TypeError, match=r"argument 6 \('cache_seqlens' in causal-conv1d\) must be passed by keyword"):
        BY_NAME["causal_conv1d_update"].bind((1, 2, 3, None, None, None), {})


@pytest.mark.parametrize("output_final_state", [False, True])
@pytest.mark.parametrize("state_v_first", [False, True])
def test_the_fakes_lay_out_what_the_op_returns(output_final_state, state_v_first, gen):
    """A compiled graph checks each output against its fake: the fake's shapes, dtypes and strides are
    the eager op's, for the outputs asked for and those not."""
    B, T, H, HV, K, V = 2, 5, 2, 4, 8, 6
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -torch.rand(B, T, HV, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    state = torch.randn(B, HV, *((V, K) if state_v_first else (K, V)), generator=gen)
    values = dict(
        q=q, k=k, v=v, g=g, beta=beta, scale=None, initial_state=state, output_final_state=output_final_state,
        cu_seqlens=None, use_qk_l2norm_in_kernel=False, state_v_first=state_v_first,
    )  # fmt: skip
    op = library.BY_NAME["chunk_gated_delta_rule"]
    fakes = library._fake_outputs(op, tuple(values[n] for n in op.names))
    with torch.no_grad():
        real = library._as_outputs(gdn.chunk_gated_delta_rule(**values), 2)
    assert [(t.shape, t.dtype, t.stride()) for t in fakes] == [(t.shape, t.dtype, t.stride()) for t in real]


def test_the_op_names_read_without_torch_are_the_declared_specs_in_their_order():
    from gdn.op_names import OP_NAMES
    from gdn.ops import PUBLIC

    assert tuple(spec.name for spec in SPECS) == OP_NAMES
    assert tuple(BY_NAME)[: len(SPECS)] == OP_NAMES
    assert tuple(PUBLIC) == OP_NAMES


def test_a_declaration_whose_name_is_not_a_literal_is_an_error_naming_its_line():
    from gdn.op_names import _declared

    assert _declared('X = 1\nOpSpec("b", ())\nOpSpec(\n    "a", ()\n)\n') == ("b", "a")
    with pytest.raises(ValueError, match=r"^gdn.calls line 2: expected an OpSpec whose first argument is its name$"):
        _declared('NAME = "a"\nOpSpec(NAME, ())\n')


def test_an_install_of_bytecode_only_is_refused_on_import_with_the_reason(tmp_path):
    """gdn reads its ops' and backends' declarations from its source files (and Triton compiles its
    kernels from theirs): a copy of the package compiled with its sources removed is refused by
    `import gdn`, saying so, rather than failing to decode bytecode as text or listing no backend."""
    package = tmp_path / "gdn"
    shutil.copytree(SRC / "gdn", package, ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(package, quiet=1, legacy=True)
    for source in package.rglob("*.py"):
        source.unlink()
    done = subprocess.run(
        [sys.executable, "-c", "import gdn"],
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "ImportError: gdn needs its source files, and this install holds bytecode only" in done.stderr
    assert str(package / "calls.pyc") in done.stderr
