"""torch.compile and the ops as PyTorch custom ops (gdn.library), on the eager backend: opcheck of every
custom op; a training step (conv, l2norm, gating, chunk forward and backward) and a decode step (conv
update, pool decode) compiled with fullgraph and no graph break, equal to the same steps run eagerly.
tests/test_triton_compile.py does the same on the triton backend."""

from __future__ import annotations

import copy

import pytest
import torch

import gdn
from compile_cases import Block, custom_op, decode_inputs, decode_step, op_cases, training_step
from gdn import library
from reference import rel_err

pytestmark = pytest.mark.single_op

DEVICE = "cpu"


@pytest.fixture(autouse=True)
def eager_mode():
    gdn.set_compute_mode("eager")
    yield
    gdn.set_compute_mode(None)


@pytest.mark.parametrize("name", sorted(library.CUSTOM))
def test_opcheck_every_custom_op(name, gen):
    """Schema, fake implementation, autograd registration and AOT dispatch agree with the op."""
    args = op_cases(DEVICE, gen, grad=True)[name]
    torch.library.opcheck(custom_op(name), args)


def test_every_public_op_has_its_custom_op():
    assert {op.public for op in library.OPS} == set(gdn.calls.PREPARE)


def _explain(fn, *args, **kwargs):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args, **kwargs)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_training_step_has_no_graph_break_and_equals_eager(backend, gen):
    """The block compiled whole (fullgraph), its loss's backward through the ops' registered autograd
    (aot_eager also traces that backward into a graph of its own)."""
    check_training_step(Block(gen, DEVICE), torch.randn(2, 9, 32, generator=gen), backend, tol=1e-5)


def test_a_compiled_decode_step_has_no_graph_break_and_writes_the_pools_like_eager(gen):
    check_decode_step(decode_inputs(DEVICE, gen), tol=1e-6)


def check_decode_step(inputs: dict, tol: float) -> None:
    assert _explain(decode_step, **{n: t.clone() for n, t in inputs.items()}).graph_break_count == 0
    before = {n: t.clone() for n, t in inputs.items()}
    eager = {n: t.clone() for n, t in inputs.items()}
    expected = decode_step(**eager)
    torch._dynamo.reset()
    got = torch.compile(decode_step, backend="eager", fullgraph=True)(**inputs)
    assert rel_err(got, expected) <= tol
    for pool in ("conv_state", "pool"):
        assert not torch.equal(inputs[pool], before[pool]), f"{pool} was not written"
        assert rel_err(inputs[pool], eager[pool]) <= tol, pool


def check_training_step(block: torch.nn.Module, x: torch.Tensor, backend: str, tol: float) -> None:
    assert _explain(block, x).graph_break_count == 0
    expected = training_step(copy.deepcopy(block), x)
    torch._dynamo.reset()
    got = training_step(torch.compile(block, backend=backend, fullgraph=True), x)
    for name, a, b in zip(["loss", *(n for n, _ in block.named_parameters())], got, expected, strict=True):
        assert rel_err(a, b) <= tol, name


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
