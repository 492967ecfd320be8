"""An op added from one file (this one): its spec, its call and validation, its eager implementation,
registered with gdn.op_registration.register_op; then called through the public machinery as a built-in
op is: bound and validated, resolved, run eagerly, and inside torch.compile as a custom op with its
schema, its fake and its autograd."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import pytest
import torch

import gdn
from gdn import library, op_specs, resolve
from gdn._validate import Checker
from gdn.backends.base import Backend
from gdn.backends.eager import EAGER
from gdn.calls import PREPARE, Arguments, Call
from gdn.op_registration import register_op, unregister_op
from gdn.op_specs import Arg, OpSpec, Output
from gdn.probe_cases import Case
from reference import rel_err

pytestmark = pytest.mark.probe

NAME = "toy_scaled_sum"
TOY = OpSpec(
    NAME,
    (Arg("x"), Arg("y"), Arg("alpha", "float", 1.0, keyword_only=True)),
    (Output("out", like="x"),),
    grads=("x", "y"),
)
TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-2}


@dataclass(slots=True)
class ToyCall(Call):
    x: torch.Tensor
    y: torch.Tensor
    alpha: float


def _build(spec: OpSpec, arguments: Arguments) -> ToyCall:
    """alpha * x + y, for x and y of one shape and dtype."""
    c = Checker(spec.name)
    x, y = c.tensor("x", arguments["x"]), c.tensor("y", arguments["y"])
    c.float_dtype("x", x)
    c.same_dtype("y", y, "x", x)
    c.shape("y", y, list(x.shape), "(same as x)")
    c.same_device({"x": x, "y": y})
    return ToyCall(x, y, c.positive_real("alpha", arguments["alpha"], "a positive real number"))


def _eager(call: ToyCall) -> torch.Tensor:
    return (call.alpha * call.x.float() + call.y.float()).to(call.x.dtype)


def _probe_cases(gen: torch.Generator):
    yield Case("rows", {"x": torch.randn(4, 33, generator=gen), "y": torch.randn(4, 33, generator=gen)}, ("x", "y"))


@pytest.fixture(scope="module")
def toy_scaled_sum():
    """The op's public function; the op is removed after this module's tests (other modules list the
    built-in ops)."""
    yield register_op(TOY, _build, _eager, _probe_cases)
    unregister_op(NAME)


def _inputs(gen: torch.Generator, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(3, 5, 7, generator=gen).to(dtype), torch.randn(3, 5, 7, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_the_added_op_computes_through_its_public_function(toy_scaled_sum, gen, dtype):
    x, y = _inputs(gen, dtype)
    out = toy_scaled_sum(x, y, alpha=0.75)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, 0.75 * x.double() + y.double()) < TOL[dtype]
    assert toy_scaled_sum.__name__ == NAME and "alpha * x + y" in toy_scaled_sum.__doc__
    assert inspect.signature(toy_scaled_sum) == TOY.signature()


def test_the_added_op_is_resolved_and_recorded(toy_scaled_sum, gen):
    x, y = _inputs(gen)
    toy_scaled_sum(x, y)
    record = next(r for r in gdn.resolutions() if r["op"] == NAME and r["device"] == "cpu")
    assert record["backend"] == resolve.resolve(NAME, "cpu").backend == "eager"


@pytest.mark.parametrize(
    ("peer", "served_by"),
    [
        (lambda call: call.alpha * call.x + call.y, "toy-peer"),
        (lambda call: call.alpha * call.x - call.y, "eager"),  # a wrong kernel: its probe fails
    ],
    ids=["right", "wrong"],
)
def test_another_backend_serves_the_added_op_after_its_probe(toy_scaled_sum, gen, peer, served_by):
    gdn.register_backend(Backend("toy-peer", ops={NAME: peer}, devices=("cpu",)))
    try:
        gdn.set_compute_mode("toy-peer")
        x, y = _inputs(gen)
        assert rel_err(toy_scaled_sum(x, y, alpha=0.5), 0.5 * x.double() + y.double()) < TOL[torch.float32]
        [record] = [r for r in gdn.resolutions() if r["op"] == NAME]
        assert record["backend"] == served_by
        probe = record["probe"] if served_by == "toy-peer" else record["rejected"][0]["probe"]
        assert probe["passed"] is (served_by == "toy-peer") and "rows" in str(probe)
    finally:
        gdn.set_compute_mode(None)
        gdn.unregister_backend("toy-peer")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"z": 1}, TypeError, rf"^{NAME}\(\) got an unexpected keyword argument 'z'$"),
        ({"alpha": -1.0}, ValueError, rf"^{NAME}: argument 'alpha' expected a positive real number"),
        ({"alpha": "2"}, TypeError, rf"^{NAME}: argument 'alpha' expected a positive real number, got str$"),
    ],
)
def test_the_added_op_validates_its_calls(toy_scaled_sum, gen, kwargs, error, message):
    x, y = _inputs(gen)
    with pytest.raises(error, match=message):
        toy_scaled_sum(x, y, **kwargs)


def test_the_added_op_refuses_a_bad_call_with_pythons_and_its_own_words(toy_scaled_sum, gen):
    x, y = _inputs(gen)
    with pytest.raises(TypeError, match=rf"^{NAME}\(\) takes 2 positional arguments but 3 were given$"):
        toy_scaled_sum(x, y, 2.0)
    with pytest.raises(ValueError, match=rf"^{NAME}: argument 'y' expected shape \(same as x\) = \[3, 5, 7\]"):
        toy_scaled_sum(x, y[:, :2])
    with pytest.raises(TypeError, match=rf"^{NAME}: argument 'x' expected dtype in \(bfloat16, float16, float32\)"):
        PREPARE[NAME](x.double(), y.double())


def test_the_added_op_has_its_custom_ops_and_fakes(toy_scaled_sum, gen):
    assert str(torch.ops.gdn.toy_scaled_sum.default._schema) == (
        f"gdn::{NAME}(Tensor x, Tensor y, float alpha) -> Tensor"
    )
    assert str(torch.ops.gdn.toy_scaled_sum_backward.default._schema) == (
        f"gdn::{NAME}_backward(Tensor x, Tensor y, float alpha, Tensor[] grads) -> Tensor[]"
    )
    x, y = _inputs(gen)
    x, y = x.transpose(0, 2), y.transpose(0, 2)  # strided inputs: the fake says the output is dense
    real = library.CUSTOM[NAME](x, y, 2.0)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = library.CUSTOM[NAME](mode.from_tensor(x), mode.from_tensor(y), 2.0)
    assert (fake.shape, fake.dtype, fake.stride()) == (real.shape, real.dtype, real.stride())


def test_the_added_op_compiles_whole_with_its_gradients(toy_scaled_sum, gen):
    x, y = _inputs(gen)

    def loss(x, y):
        return (toy_scaled_sum(x, y, alpha=1.5) ** 2).sum()

    torch._dynamo.reset()
    assert torch._dynamo.explain(loss)(x, y).graph_break_count == 0
    grads = {}
    for label, fn in (("eager", loss), ("compiled", torch.compile(loss, backend="eager", fullgraph=True))):
        xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
        fn(xs, ys).backward()
        grads[label] = (xs.grad, ys.grad)
    xd, yd = x.double(), y.double()
    expected = (2 * (1.5 * xd + yd) * 1.5, 2 * (1.5 * xd + yd))
    for got in grads.values():
        assert rel_err(got[0], expected[0]) < 1e-6 and rel_err(got[1], expected[1]) < 1e-6


def test_an_added_op_cannot_take_a_taken_name():
    with pytest.raises(ValueError, match=r"argument 'spec' expected an op of a new name, got 'l2norm'"):
        register_op(OpSpec("l2norm", (Arg("x"),), (Output("y", like="x"),)), _build, _eager)


def test_every_built_in_op_has_its_eager_implementation():
    from gdn.backends.eager import OPS
    from gdn.op_names import OP_NAMES

    assert list(OPS) == list(OP_NAMES)


def test_an_added_op_leaves_when_unregistered(gen):
    name = f"{NAME}_once"
    public = register_op(dataclasses.replace(TOY, name=name), _build, _eager)
    x, y = _inputs(gen)
    assert rel_err(public(x, y), x.double() + y.double()) < TOL[torch.float32]
    unregister_op(name)
    assert name not in PREPARE and name not in library.CUSTOM and name not in op_specs.BY_NAME
    assert EAGER.implementation(name) is None and all(r["op"] != name for r in gdn.resolutions())
    with pytest.raises(ValueError, match=r"argument 'name' expected an op register\(\) added, got 'l2norm'"):
        unregister_op("l2norm")
