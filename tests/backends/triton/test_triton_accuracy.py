"""The triton backend's rows of the accuracy table (gdn.matrix.accuracy): every op, bf16 and fp32, both
gate regimes, dense and packed, against the fp64 references, printed as the table prints them (the
kernels session shows them under the interpreter with each Triton version), and held to the bounds of
their precision: fp32 far under 1e-4, bf16 under the numeric probe's half-precision tolerance.

Without a CUDA device the kernels run under the Triton interpreter (set before they are imported).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from gdn.matrix.accuracy import cases, measure, table
from gdn.resolve import backends

pytestmark = pytest.mark.single_op

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# fp32 arithmetic throughout; the qwen regime's dg, a difference of large terms, sits near 6e-5 (the
# interpreter, 2026-12-04): a wrong term costs O(1)
FP32_BOUND = 1e-4
# bf16 operands between the stages: a few 1e-3 (the H200, 2026-12-04: worst 4e-3)
BF16_BOUND = 2e-2


@pytest.fixture(scope="module")
def rows(request) -> list:
    triton = backends()["triton"]
    reason = triton.why_unavailable(DEVICE.type)
    if reason:
        pytest.skip(f"triton does not run on {DEVICE.type} here: {reason}")
    found = measure.measure(DEVICE, {"triton": triton}, cases.size_for(DEVICE))
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + "\n".join(table.lines(found)))
    return found


def test_every_case_of_every_op_is_measured(rows):
    assert {(r.op, r.dtype, r.regime, r.layout) for r in rows} == {
        (c.op, c.dtype, c.regime, c.layout) for c in measure.cases()
    }
    for row in rows:
        assert row.status == "measured", (row.op, row.reason)
        assert list(row.errors) == list(cases.QUANTITIES[row.op])


@pytest.mark.parametrize(("dtype", "bound"), [("float32", FP32_BOUND), ("bfloat16", BF16_BOUND)])
def test_errors_are_within_their_precision(rows, dtype, bound):
    over = [(r.op, r.regime, r.layout, q, e) for r in rows if r.dtype == dtype for q, e in r.errors.items()]
    assert [o for o in over if o[-1] is None or o[-1] > bound] == []
