"""The accuracy table (gdn.matrix.accuracy): its fp64 references agree with the tests' own, independently
written ones; every op's eager rows are measured on the CPU in both dtypes and both gate regimes with
every quantity, fp32 far under 1e-4; a wrong kernel is measured as wrong; a refusing, raising or
non-finite kernel is a row that says so."""

from __future__ import annotations

import math

import pytest
import torch

from gdn.backends.base import Backend
from gdn.backends.eager import EAGER
from gdn.matrix.accuracy import cases, measure, reference
from reference import causal_conv, gdn_recurrence, rel_err

pytestmark = pytest.mark.single_op

CPU = torch.device("cpu")
OP = "chunk_gated_delta_rule"


@pytest.mark.parametrize("layout", cases.LAYOUTS)
def test_the_gated_reference_agrees_with_the_tests_own(layout):
    size = cases.HOST
    inputs = cases.gated_case(size, layout, "qwen", torch.float32, CPU, seed=7)
    args = (inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta)
    kwargs = dict(initial_state=inputs.initial_state, cu_seqlens=inputs.cu_seqlens)
    o, final = reference.gated_delta(*args, scale=size.K**-0.5, l2norm=True, **kwargs)
    o_tests, final_tests = gdn_recurrence(*args, scale=size.K**-0.5, l2norm=True, **kwargs)
    assert rel_err(o, o_tests) < 1e-12 and rel_err(final, final_tests) < 1e-12


def test_the_conv_reference_agrees_with_the_tests_own():
    gen = torch.Generator().manual_seed(3)
    x, w, b, history = (torch.randn(*s, generator=gen) for s in ((6, 9), (6, 4), (6,), (6, 3)))
    out, final = reference.causal_conv(x, w, b, "silu", history)
    assert rel_err(out, causal_conv(x[None], w, b, "silu", history[None])[0]) < 1e-12
    assert torch.equal(final, torch.cat([history, x], dim=-1)[:, -3:].double())


def test_the_qwen_regime_is_transformers_initialisation():
    """g = -exp(A_log) * softplus(a + 1) with A_log = log U(0, 16): per value head, a decay between 0
    and 16 times softplus, so that some heads forget within a token."""
    g = cases.gate("qwen", (1, 4096, 32), torch.Generator().manual_seed(0))
    assert g.max() < 0 and g.min() < -16  # softplus(a + 1) reaches past 1 for a > 0
    per_head = (g / -torch.nn.functional.softplus(torch.zeros(1))).mean(dim=(0, 1))
    assert per_head.max() > 8 * per_head.min()


@pytest.fixture(scope="module")
def eager_rows() -> list:
    return measure.measure(CPU, {"eager": EAGER}, cases.HOST)


def test_every_op_has_eager_rows_in_both_dtypes_and_regimes_with_every_quantity(eager_rows):
    found = {(r.op, r.dtype, r.regime, r.layout) for r in eager_rows}
    assert found == {(c.op, c.dtype, c.regime, c.layout) for c in measure.cases()}
    for op in cases.OPS:
        dtypes = {r.dtype for r in eager_rows if r.op == op}
        regimes = {r.regime for r in eager_rows if r.op == op}
        assert dtypes == {"bfloat16", "float32"}
        assert regimes == ({None} if op in cases.CONV_OPS else {"mild", "qwen"})
    for row in eager_rows:
        assert row.status == "measured" and list(row.errors) == list(cases.QUANTITIES[row.op])
        assert all(e is not None and math.isfinite(e) for e in row.errors.values())


def test_fp32_eager_errors_are_far_under_1e_4(eager_rows):
    worst = max(e for r in eager_rows if r.dtype == "float32" for e in r.errors.values())
    assert worst < 1e-5


def test_a_wrong_kernel_is_measured_as_wrong():
    """The table must be able to tell: a chunk kernel whose gate gradient is 20% too large shows dg
    near 0.2 and nothing else."""

    class WrongGate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, g):
            return g.view_as(g)

        @staticmethod
        def backward(ctx, dg):
            return dg * 1.2

    def kernel(call):
        call.g = WrongGate.apply(call.g)
        return EAGER.ops[OP](call)

    wrong = Backend(name="wrong", ops={OP: kernel}, devices=("cpu",), needs_probe=False)
    [row] = measure.measure(CPU, {"wrong": wrong}, cases.HOST, (OP,), dtypes=["float32"])[:1]
    assert row.errors["dg"] == pytest.approx(0.2, rel=1e-3)
    assert max(e for q, e in row.errors.items() if q != "dg") < 1e-5


def test_refusals_errors_and_non_finite_outputs_are_rows_that_say_so():
    class Refuses(Backend):
        def refusal(self, op, call):
            return "takes half precision only" if call.q.dtype == torch.float32 else None

    def raises(call):
        raise RuntimeError("kernel exploded")

    def nan(call):
        o, final = EAGER.ops[OP](call)
        return o * float("nan"), final

    found = {}
    for name, backend in (
        ("refuses", Refuses(name="refuses", ops={OP: EAGER.ops[OP]}, devices=("cpu",), needs_probe=False)),
        ("raises", Backend(name="raises", ops={OP: raises}, devices=("cpu",), needs_probe=False)),
        ("nan", Backend(name="nan", ops={OP: nan}, devices=("cpu",), needs_probe=False)),
    ):
        found[name] = measure.measure(CPU, {name: backend}, cases.HOST, (OP,), dtypes=["float32"])[0]
    assert (found["refuses"].status, found["refuses"].reason) == ("refused", "takes half precision only")
    assert found["refuses"].errors == {}
    assert found["raises"].status == "error" and found["raises"].reason == "RuntimeError: kernel exploded"
    assert found["nan"].status == "measured" and found["nan"].errors["o"] is None
    assert found["nan"].errors["final_state"] is not None


def test_a_spent_budget_leaves_the_rest_not_run():
    rows = measure.measure(CPU, {"eager": EAGER}, cases.HOST, (OP,), budget_s=0.0)
    assert rows and all(r.status == "not_run" and "budget" in r.reason for r in rows)
