"""The custom ops and torch.compile on the triton backend: opcheck of every custom op, a compiled
training step and decode step without a graph break, equal to the same steps run eagerly. Without a
CUDA device the kernels run under the Triton interpreter (set before they are imported), as in the
other test_triton_* modules; tests/test_compile.py does the same on the eager backend."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

import gdn
from compile_cases import Block, custom_op, decode_inputs, op_cases
from gdn import library
from test_compile import check_decode_step, check_training_step

pytestmark = pytest.mark.single_op

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def triton_mode():
    gdn.set_compute_mode("triton")
    yield
    gdn.set_compute_mode(None)


@pytest.mark.parametrize("name", sorted(library.CUSTOM))
def test_opcheck_every_custom_op(name, gen):
    args = op_cases(DEVICE, gen, grad=True)[name]
    torch.library.opcheck(custom_op(name), args)
    assert gdn.resolve.last_route().startswith("triton:") or name in FORWARD_ONLY_WITH_GRAD


# the triton backend serves these forward only: a call whose inputs need gradients runs eager
FORWARD_ONLY_WITH_GRAD = {"fused_recurrent_gated_delta_rule", "causal_conv1d_fn"}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_training_step_has_no_graph_break_and_equals_eager(backend, gen):
    block = Block(gen, DEVICE)
    check_training_step(block, torch.randn(2, 9, 32, generator=gen).to(DEVICE), backend, tol=1e-5)


def test_a_compiled_decode_step_has_no_graph_break_and_writes_the_pools_like_eager(gen):
    check_decode_step(decode_inputs(DEVICE, gen), tol=1e-6)
