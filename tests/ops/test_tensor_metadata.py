"""gdn.tensor_metadata: SameMetadata says True exactly for tensors that repeat the metadata it was built
from (type, shape, dtype, device, strides), through torch's guard where this torch has one and through
Python's comparison otherwise, and holds no tensor."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from gdn import tensor_metadata
from gdn.tensor_metadata import SameMetadata, metadata

pytestmark = pytest.mark.single_op


@pytest.fixture(params=["torch-guard", "python"])
def check(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(tensor_metadata, "_torch_guard", lambda tensors: None)
    return request.param


def others(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Tensors that differ from x in one part of its metadata each."""
    return {
        "shape": torch.randn(x.shape[0] + 1, x.shape[1]),
        "dtype": x.to(torch.float64),
        "strides": torch.randn(x.shape[1], x.shape[0]).t(),
        "expanded": torch.randn(1, x.shape[1]).expand_as(x),
        "device": torch.empty_like(x, device="meta"),
        "type": torch.nn.Parameter(torch.randn_like(x), requires_grad=False),
    }


def test_only_tensors_of_the_same_metadata_match(check, gen):
    x, i = torch.randn(4, 6, generator=gen), torch.arange(4, dtype=torch.int32)
    same = SameMetadata((x, i))
    assert (same._guard is not None) == (check == "torch-guard")
    assert same(torch.randn(4, 6, generator=gen), torch.randperm(4).to(torch.int32))
    for what, other in others(x).items():
        assert metadata((other,)) != metadata((x,)), what
        assert not same(other, i), what
        assert not same(x, other), what
    assert not same(x, None) and not same(x, 3)
    assert not same(x) and not same(x, i, i), "another number of tensors"


def test_a_check_that_says_false_where_metadata_agree_differs_in_gradients_only(check, gen):
    """torch's guard also reads requires_grad: a caller told False compares metadata() to know why."""
    x = torch.randn(4, 6, generator=gen)
    same = SameMetadata((x,))
    wanting = torch.randn(4, 6, generator=gen, requires_grad=True)
    assert metadata((wanting,)) == same.metadata
    assert same(wanting) == (check == "python")


def test_arguments_that_are_not_tensors_are_compared_in_python(gen):
    x = torch.randn(4, 6, generator=gen)
    same = SameMetadata((x, None))
    assert same._guard is None
    assert same(torch.randn(4, 6, generator=gen), None) and not same(x, 1) and not same(x.double(), None)


def test_it_holds_no_tensor(check, gen):
    x = torch.randn(4, 6, generator=gen)
    same = SameMetadata((x,))
    gone = weakref.ref(x)
    del x
    gc.collect()
    assert gone() is None and same(torch.randn(4, 6, generator=gen))
