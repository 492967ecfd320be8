"""The startup conv probe: a correct adapter passes; the 26.10 dev wheel's failure (zeros for all-ones
input, large garbage otherwise), a wrong gradient, NaN and a raising kernel are each rejected with a
reason that names the case and the output."""

from __future__ import annotations

import pytest
import torch

from gdn.backends.ascendc.conv import ConvKernels, make_causal_conv1d_fn
from gdn.backends.ascendc.conv_probe import THRESHOLD, probe_conv
from standins import kernels_conv
from standins.broken import garbage_unless_ones, zeros_for_ones
from standins.support import stable

pytestmark = pytest.mark.probe

CPU = torch.device("cpu")


def adapter(**replace) -> object:
    return make_causal_conv1d_fn(ConvKernels.bind(stable(**replace)))


def doubled_dw(*args, **kwargs):
    dx, dw, db, dh0 = kernels_conv.npu_causal_conv1d_bwd(*args, **kwargs)
    return dx, dw * 2, db, dh0


def nan_output(x, *args, **kwargs):
    return kernels_conv.npu_causal_conv1d_fn(x, *args, **kwargs) * float("nan")


def raises(*args, **kwargs):
    raise RuntimeError("aclnnCausalConv1d failed: tiling rejected")


def test_a_correct_adapter_passes():
    record = probe_conv(adapter(), CPU)
    assert record["passed"] is True and record["reason"] is None
    assert record["threshold"] == THRESHOLD == 0.15
    assert isinstance(record["seed"], int)
    assert set(record["rel_err"]) >= {"ones.out", "dense.out", "dense.dweight", "dense.dinitial", "varlen.conv_states"}
    assert max(record["rel_err"].values()) < 2e-2


@pytest.mark.parametrize(
    ("replace", "reason"),
    [
        (dict(npu_causal_conv1d_fn=zeros_for_ones), "ones.out: all zeros where the reference is not"),
        (dict(npu_causal_conv1d_fn=garbage_unless_ones), "dense.out: rel err"),
        (dict(npu_causal_conv1d_bwd=doubled_dw), "ones.dweight: rel err"),
        (dict(npu_causal_conv1d_fn=nan_output), "ones.out: contains NaN or Inf"),
        (dict(npu_causal_conv1d_fn=raises), "ones: raised RuntimeError: aclnnCausalConv1d failed: tiling rejected"),
    ],
    ids=["zeros_for_ones", "garbage", "wrong_dw", "nan", "raises"],
)
def test_a_broken_adapter_is_rejected(replace, reason):
    record = probe_conv(adapter(**replace), CPU)
    assert record["passed"] is False
    assert record["reason"].startswith(reason), record["reason"]
