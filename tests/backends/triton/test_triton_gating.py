"""The triton backend's fused GDN gate against the eager backend, and what the GPU compiler makes of it.

Without a CUDA device the kernel runs under the Triton interpreter (set before it is imported).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from gdn.backends.eager import EAGER
from gdn.backends.triton import gating
from reference import rel_err
from triton_harness import DEVICE, TOL, run, run_on_hopper_compiler

OP = "fused_gdn_gating"


def both(*args):
    return run(gating.fused_gdn_gating, OP, *args), run(EAGER.ops[OP], OP, *args)


@pytest.mark.shape_grid
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((3, 7, 5), torch.float32), ((33,), torch.bfloat16), ((2, 9, 48), torch.float16), ((1, 1, 32), torch.bfloat16)],
    ids=str,
)
def test_matches_eager_on_odd_shapes(shape, dtype, gen):
    HV = shape[-1]
    A_log, dt_bias = torch.randn(HV, generator=gen).to(DEVICE), torch.randn(HV, generator=gen).to(DEVICE)
    a = (torch.randn(*shape, generator=gen) * 8).to(DEVICE, dtype)
    b = (torch.randn(*shape, generator=gen) * 4).to(DEVICE, dtype)
    (g, beta), (ref_g, ref_beta) = both(A_log, a, b, dt_bias)
    assert g.dtype == torch.float32 and g.shape == a.shape
    assert beta.dtype == dtype and beta.shape == b.shape
    assert rel_err(g, ref_g) <= 1e-5
    assert rel_err(beta, ref_beta) <= TOL[dtype]


@pytest.mark.single_op
def test_softplus_threshold_and_tails(gen):
    """softplus(x) = x above 20; below, log1p(exp(x)) stays accurate where exp(x) is far below 1."""
    x = torch.cat([torch.linspace(-40, 40, 161), torch.tensor([19.99, 20.0, 20.01, -17.0, -25.0])]).to(DEVICE)
    zero = torch.zeros(1, device=DEVICE)
    (g, _), (ref_g, _) = both(zero, x[:, None], x[:, None].clamp(-30, 30), zero)
    elementwise = ((g - ref_g).abs() / ref_g.abs()).max().item()
    assert elementwise <= 1e-5, elementwise


@pytest.mark.single_op
def test_strided_slices_of_a_projection(gen):
    """a and b as column slices of one [tokens, 3 * HV] projection are read in place."""
    tokens, HV = 37, 12
    proj = torch.randn(tokens, 3 * HV, generator=gen).to(DEVICE, torch.bfloat16)
    a, b = proj[:, HV : 2 * HV], proj[:, 2 * HV :]
    A_log, dt_bias = torch.randn(HV, generator=gen).to(DEVICE), torch.randn(HV, generator=gen).to(DEVICE)
    (g, beta), (ref_g, ref_beta) = both(A_log, a, b, dt_bias)
    assert rel_err(g, ref_g) <= 1e-5 and rel_err(beta, ref_beta) <= TOL[torch.bfloat16]
    assert beta.is_contiguous()


@pytest.mark.single_op
def test_forward_only_refuses_inputs_that_need_gradients(gen):
    A_log = torch.zeros(4, device=DEVICE, requires_grad=True)
    a = torch.randn(3, 4, generator=gen).to(DEVICE)
    with pytest.raises(NotImplementedError, match="A_log require grad"):
        run(gating.fused_gdn_gating, OP, A_log, a, a, torch.zeros(4, device=DEVICE))
    with torch.inference_mode():
        g, _ = run(gating.fused_gdn_gating, OP, A_log, a, a, torch.zeros(4, device=DEVICE))
    assert g.shape == a.shape


GATING_SCENARIO = """
from gdn.backends.triton import gating
from gdn.calls import GatingCall

def launch(tokens):
    a = torch.randn(tokens, 32, dtype=torch.bfloat16)
    A_log, dt_bias = torch.randn(32), torch.randn(32)
    return record(gating, lambda: gating.fused_gdn_gating(GatingCall(A_log, a, a, dt_bias)))["_gating_kernel"][0]

runs = [launch(n) for n in (64, 65, 4096, 4099)]
RESULT["usage"] = compile_sm90(runs[0])
RESULT["keys"] = len({launch_key(r) for r in runs})
"""


@pytest.mark.single_op
def test_compiles_for_hopper_without_spills_and_one_binary_per_length():
    result = run_on_hopper_compiler(GATING_SCENARIO)
    assert result["usage"]["spill_bytes"] in (0, None), result
    assert result["keys"] == 1, "the token count changed a specialized argument"
