"""The GDN ops as PyTorch custom ops (namespace `gdn`), for torch.compile.

Inside a compiled region the public ops call these instead of running the resolver and the backend
in Python: Dynamo sees one opaque op per call, so a training or decode step compiles without graph
breaks, and the backend is chosen when the op runs (gdn.resolve: once per op, device and mode,
recorded as outside a graph). Each op has a fake implementation (validation on the tensors' metadata,
then the outputs' shapes and dtypes) and, where it is differentiable, a registered autograd whose
backward is a custom op too: it recomputes the forward with the serving backend under autograd and
takes the gradients from it (one extra forward in the backward, no saved activations beyond the inputs).

Ops that write a pool in place declare it (`Tensor(a!)`). Outputs a call does not ask for (the final
state without output_final_state) come back as empty tensors and become None in the public op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gdn import _validate as check
from gdn import op_specs
from gdn.calls import PREPARE, SPECS
from gdn.op_specs import CustomOp, OpSpec, Output
from gdn.prepared import run_op

NAMESPACE = "gdn"


@dataclass(frozen=True)
class LibraryOp:
    """One custom op, as its op's spec (gdn.op_specs) declares it: its arguments (name, schema type;
    `Tensor(a!)` marks a pool written in place), its outputs, the arguments that get gradients (none:
    inference only), and the public op it serves."""

    name: str
    public: str
    args: tuple[tuple[str, str], ...]
    outputs: tuple[Output, ...]
    grads: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: OpSpec, form: CustomOp) -> LibraryOp:
        args = tuple((name, spec.schema_type(name, form)) for name in form.args)
        return cls(form.name, spec.name, args, form.outputs, form.grads)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.args]

    @property
    def mutates(self) -> tuple[str, ...]:
        return tuple(name for name, kind in self.args if "!" in kind)

    def schema(self) -> str:
        args = ", ".join(f"{kind} {name}" for name, kind in self.args)
        count = len(self.outputs)
        returns = "Tensor" if count == 1 else "(" + ", ".join(["Tensor"] * count) + ")"
        return f"({args}) -> {returns}"

    def backward_schema(self) -> str:
        args = ", ".join(f"{kind.replace('(a!)', '')} {name}" for name, kind in self.args)
        return f"({args}, Tensor[] grads) -> Tensor[]"


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0)


def _dense_output(t: torch.Tensor) -> torch.Tensor:
    """An output as the fake implementation describes it: contiguous, at the start of its storage (a
    backend may return a slice of a larger buffer; autograd gives a strided input's gradient the
    input's strides or its own). A compiled graph lays out and checks each output by its fake."""
    return t if t.is_contiguous() and t.storage_offset() == 0 else t.clone(memory_format=torch.contiguous_format)


def _as_outputs(result: Any, count: int) -> tuple[torch.Tensor, ...]:
    """The public op's result as the custom op's outputs: a missing final state becomes empty."""
    parts = result if isinstance(result, tuple) else (result,)
    first = parts[0]
    padded = [_empty(first) if p is None else _dense_output(p) for p in parts]
    padded += [_empty(first)] * (count - len(parts))
    return tuple(padded) if count > 1 else padded[0]


def _validated(op: str, values: dict[str, Any]):
    """Validation on metadata alone: the value checks (which read tensors) are held and dropped."""
    with check.deferred_value_checks():
        return PREPARE[op](**values)


def _fake(op: LibraryOp, values: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """The outputs' shapes and dtypes after validation: each like the input its spec names, in the dtype
    it names; an output the call does not ask for is empty; a final state is shaped from the call."""
    call = _validated(op.public, values)
    first = values[op.outputs[0].like]
    outputs = []
    for output in op.outputs:
        if output.asked_by is not None and not values[output.asked_by]:
            outputs.append(_empty(first))
        elif output.like is None:
            outputs.append(_FINAL_STATES[output.name](call, values))
        else:
            dtype = None if output.dtype is None else getattr(torch, output.dtype)
            outputs.append(torch.empty_like(values[output.like], dtype=dtype, memory_format=torch.contiguous_format))
    return tuple(outputs)


def _gdn_final_state(call, values: dict[str, Any]) -> torch.Tensor:
    shapes = call.shapes
    inner = (shapes.V, shapes.K) if values["state_v_first"] else (shapes.K, shapes.V)
    return values["v"].new_empty(shapes.N, shapes.HV, *inner, dtype=torch.float32)


def _conv_final_states(call, values: dict[str, Any]) -> torch.Tensor:
    x, weight = values["x"], values["weight"]
    return x.new_empty(x.shape[0], x.shape[1], weight.shape[1] - 1)


# the outputs whose shape follows from the validated call, by the name their spec gives them
_FINAL_STATES = {"final_state": _gdn_final_state, "final_states": _conv_final_states}


def _forward(op: LibraryOp) -> Callable:
    # the leading tensors of an op with prepared steps go by position, the way its steps take them
    # (gdn.prepared), so that a compiled decode loop's calls run the prepared step as eager ones do
    width = op_specs.BY_NAME[op.public].step_tensors
    count = len(op.outputs)

    def impl(*args):
        options = dict(zip(op.names[width:], args[width:], strict=True))
        return _as_outputs(run_op(op.public, args[:width], options), count)

    return impl


def _backward(op: LibraryOp) -> Callable:
    def impl(*args):
        *inputs, grads = args
        values = dict(zip(op.names, inputs, strict=True))
        leaves = {n: values[n].detach().requires_grad_() for n in op.grads if values[n] is not None}
        with _autograd_inside_an_op():
            outputs = _as_outputs(run_op(op.public, (), {**values, **leaves}), len(op.outputs))
        outputs = (outputs,) if len(op.outputs) == 1 else outputs
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g.numel() and o.requires_grad]
        with _autograd_inside_an_op():
            found = torch.autograd.grad(
                [o for o, _ in pairs], list(leaves.values()), [g for _, g in pairs], allow_unused=True
            )
        by_name = dict(zip(leaves, found, strict=True))
        # no result may share memory with an input or with another result (two gradients can be views of
        # one buffer: the conv's x and initial_states split one gradient)
        seen = [t for t in (*inputs, *grads) if isinstance(t, torch.Tensor)]
        results = []
        for n in op.grads:
            if values[n] is None:
                result = _empty(inputs[0])
            else:
                result = _unaliased(_dense_output(_grad_or_zeros(by_name.get(n), values[n])), seen)
            seen.append(result)
            results.append(result)
        return results

    return impl


@contextlib.contextmanager
def _autograd_inside_an_op() -> Iterator[None]:
    """Autograd for the recomputed forward. A custom op's implementation runs below the dispatcher's
    autograd keys (they are in the thread's exclude set), where no op records a graph even with grad
    mode on; this lifts that exclusion for the block, so the backend's own autograd works as outside."""
    dispatch = torch._C
    excluded = dispatch._dispatch_tls_local_exclude_set()
    autograd = dispatch.DispatchKeySet(dispatch.DispatchKey.AutogradFunctionality)
    with (
        dispatch._ForceDispatchKeyGuard(dispatch._dispatch_tls_local_include_set(), excluded - autograd),
        torch.enable_grad(),
    ):
        yield


def _unaliased(t: torch.Tensor, others: list[torch.Tensor]) -> torch.Tensor:
    """t, or a copy where it shares memory with one of others (a gradient that passes an incoming one
    through): a custom op's output may not alias its inputs."""
    storage = t.untyped_storage().data_ptr()
    shared = any(o.untyped_storage().data_ptr() == storage for o in others if o.numel())
    return t.clone() if shared and t.numel() else t


def _grad_or_zeros(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if grad is None else grad


def _backward_fake(op: LibraryOp) -> Callable:
    def fake(*args):
        values = dict(zip(op.names, args[:-1], strict=True))
        first = args[0]
        return [
            _empty(first) if values[n] is None else torch.empty_like(values[n], memory_format=torch.contiguous_format)
            for n in op.grads
        ]

    return fake


def _autograd(op: LibraryOp, backward_op) -> tuple[Callable, Callable]:
    tensor_args = [n for n, kind in op.args if kind.startswith("Tensor")]

    def setup_context(ctx, inputs, output) -> None:
        values = dict(zip(op.names, inputs, strict=True))
        ctx.others = {n: v for n, v in values.items() if n not in tensor_args}
        ctx.present = [n for n in tensor_args if values[n] is not None]
        ctx.save_for_backward(*(values[n] for n in ctx.present))

    def backward(ctx, *grads):
        values = dict(ctx.others) | dict.fromkeys(tensor_args) | dict(zip(ctx.present, ctx.saved_tensors, strict=True))
        first = ctx.saved_tensors[0]
        given = [_empty(first) if g is None else g.contiguous() for g in grads]
        found = dict(zip(op.grads, backward_op(*(values[n] for n in op.names), given), strict=True))
        return tuple(found[n] if n in found and values[n] is not None else None for n in op.names)

    return setup_context, backward


def _register(op: LibraryOp):
    custom = torch.library.custom_op(
        f"{NAMESPACE}::{op.name}", _forward(op), mutates_args=op.mutates, schema=op.schema()
    )
    custom.register_fake(lambda *args: _fake_outputs(op, args))
    if op.grads:
        backward_op = torch.library.custom_op(
            f"{NAMESPACE}::{op.name}_backward", _backward(op), mutates_args=(), schema=op.backward_schema()
        )
        backward_op.register_fake(_backward_fake(op))
        setup_context, backward = _autograd(op, backward_op)
        custom.register_autograd(backward, setup_context=setup_context)
    return custom


def _fake_outputs(op: LibraryOp, args: tuple) -> Any:
    outputs = _fake(op, dict(zip(op.names, args, strict=True)))
    return outputs if len(outputs) > 1 else outputs[0]


BY_NAME: dict[str, LibraryOp] = {}
CUSTOM: dict[str, Any] = {}


def register(spec: OpSpec) -> None:
    """The op's custom ops (its spec's forms), registered with torch: a built-in op's at import, an op
    gdn.op_registration adds when it is added."""
    for form in spec.custom_ops:
        op = LibraryOp.of(spec, form)
        BY_NAME[op.name] = op
        CUSTOM[op.name] = _register(op)


def unregister(spec: OpSpec) -> None:
    """Forget the op's custom ops (torch keeps them, and takes their names again where registered anew)."""
    for form in spec.custom_ops:
        del BY_NAME[form.name], CUSTOM[form.name]


for _spec in SPECS:
    register(_spec)
# the built-in ops' custom ops, in their specs' order
OPS = tuple(BY_NAME.values())


def call(public: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The public op `public` through its custom op, as a compiled region runs it. A call that sets an
    argument no custom op carries (a refused peer feature) is validated like outside a graph, which
    raises the op's own error."""
    spec = op_specs.BY_NAME[public]
    values = spec.bind(args, kwargs)
    if any(values.get(a.name, a.default) is not a.default for a in spec.args if not a.carried):
        PREPARE[public](*args, **kwargs)
    scale = values.get("scale")
    if scale is not None and type(scale) is not float:
        values["scale"] = _given_scale(public, scale)
    op = _library_op(spec, values)
    outputs = CUSTOM[op.name](*(values[n] for n in op.names))
    return _public_result(op, values, outputs)


def _given_scale(public: str, scale: object) -> float:
    """A scale other than a float, validated as outside a graph, as the float the schema takes. Dynamo
    first traces a numpy scalar as a 0-d array of data: float() of it is data-dependent, and Dynamo
    traces again with the scalar as a constant (one graph, specialized on the value). Under
    fullgraph=True it cannot, and reports the data-dependent value: pass a Python float there."""
    if isinstance(scale, np.ndarray):
        scale = float(scale)
    return check.Checker(public).given_scale(scale)


def _library_op(spec: OpSpec, values: dict[str, Any]) -> LibraryOp:
    """The custom op that serves a call: a later form where the argument that selects it is given."""
    form = next((f for f in spec.custom_ops[1:] if values[f.selected_by] is not None), spec.custom_ops[0])
    return BY_NAME[form.name]


def _public_result(op: LibraryOp, values: dict[str, Any], outputs: Any) -> Any:
    """The custom op's outputs as the public op returns them: an output the call did not ask for is
    None, or left out where its spec drops it."""
    if len(op.outputs) == 1:
        return outputs
    kept = []
    for output, tensor in zip(op.outputs, outputs, strict=True):
        if output.asked_by is not None and not values[output.asked_by]:
            if output.dropped:
                continue
            tensor = None
        kept.append(tensor)
    return kept[0] if len(kept) == 1 else tuple(kept)
