"""torch.compile and the ops as PyTorch custom ops (gdn.library), on the eager backend: opcheck of every
custom op; a training step (conv, l2norm, gating, chunk forward and backward) and a decode step (conv
update, pool decode) compiled with fullgraph and no graph break, equal to the same steps run eagerly.
tests/backends/triton/test_triton_compile.py does the same on the triton backend."""

from __future__ import annotations

import pytest
import torch

import gdn
from compile_cases import (
    Block,
    check_decode_step,
    check_outputs_laid_out_as_their_fakes,
    check_training_step,
    decode_inputs,
    op_cases,
    opcheck,
)
from gdn import library

pytestmark = pytest.mark.single_op

DEVICE = "cpu"


@pytest.mark.parametrize("name", sorted(library.CUSTOM))
def test_opcheck_every_custom_op(name, gen):
    assert opcheck(name, DEVICE, gen, "eager") == "eager"


@pytest.mark.parametrize("name", sorted(op.name for op in library.OPS if op.grads))
def test_strided_inputs_give_outputs_laid_out_as_the_fakes_say(name, gen):
    check_outputs_laid_out_as_their_fakes(name, DEVICE, gen, "eager")


def test_every_public_op_has_its_custom_op():
    assert {op.public for op in library.OPS} == set(gdn.calls.PREPARE)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_training_step_has_no_graph_break_and_equals_eager(backend, gen):
    """aot_eager also traces the backward into a graph of its own (the ops' backward custom ops)."""
    check_training_step(Block(gen, DEVICE), torch.randn(2, 9, 32, generator=gen), backend, "eager", tol=1e-5)


def test_a_compiled_decode_step_has_no_graph_break_and_writes_the_pools_like_eager(gen):
    check_decode_step(decode_inputs(DEVICE, gen), "eager", tol=1e-6)


def test_inside_a_compiled_region_a_refused_peer_feature_still_raises_its_error(gen):
    args = op_cases(DEVICE, gen, grad=False)["chunk_gated_delta_rule"][:5]

    def step(q, k, v, g, beta):
        return gdn.chunk_gated_delta_rule(q, k, v, g, beta, allow_neg_eigval=True)

    torch._dynamo.reset()
    with pytest.raises(TypeError, match="argument 'allow_neg_eigval' expected False"):
        torch.compile(step, backend="eager")(*args)
    # fullgraph has no eager fallback: Dynamo reports the op's error inside its own
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match="argument 'allow_neg_eigval' expected False"):
        torch.compile(step, backend="eager", fullgraph=True)(*args)


@pytest.mark.parametrize("op", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule_update"])
def test_a_numpy_scale_inside_a_compiled_region_is_the_float_it_equals(op, gen):
    """Dynamo traces a numpy scalar as data (a 0-d tensor); the op hands its custom op the float it
    equals, which Dynamo then specializes on: one graph, no break, a new value recompiles."""
    import numpy as np

    pool_op = op.endswith("_update")
    args = op_cases(DEVICE, gen, grad=False)[op][: 7 if pool_op else 5]
    options = {"state_v_first": True} if pool_op else {}  # the case's pool is value-first

    def step(*tensors_and_scale):
        *tensors, scale = tensors_and_scale
        out = getattr(gdn, op)(*tensors, scale=scale, **options)
        return out[0] if isinstance(out, tuple) else out

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager")
    for scale in (np.float32(0.5), np.float64(0.25), np.int64(2)):
        fresh = [t.clone() for t in args]  # the pool op writes its pool
        want = step(*fresh, float(scale))
        assert torch.equal(compiled(*[t.clone() for t in args], scale), want), scale
    explained = torch._dynamo.explain(step)(*args, np.float32(0.5))
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.parametrize(("scale", "got"), [(True, "bool"), ("0.5", "str"), (torch.tensor(0.5), "torch.Tensor")])
def test_inside_a_compiled_region_a_scale_that_is_not_a_real_number_is_refused(scale, got, gen):
    """The custom op's schema would take a bool as 1.0: the scale is validated before it goes in."""
    args = op_cases(DEVICE, gen, grad=False)["chunk_gated_delta_rule"][:5]

    def step(q, k, v, g, beta):
        return gdn.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)

    torch._dynamo.reset()
    with pytest.raises(TypeError, match=f"argument 'scale' expected None or a positive real number, got {got}"):
        torch.compile(step, backend="eager")(*args)
