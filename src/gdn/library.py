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
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gdn import _validate as check
from gdn.calls import PREPARE, positional_names
from gdn.prepared import STEP_TENSORS, run_op

NAMESPACE = "gdn"

GDN_ARGS = (
    ("q", "Tensor"),
    ("k", "Tensor"),
    ("v", "Tensor"),
    ("g", "Tensor"),
    ("beta", "Tensor"),
    ("scale", "float?"),
    ("initial_state", "Tensor?"),
    ("output_final_state", "bool"),
    ("cu_seqlens", "Tensor?"),
    ("use_qk_l2norm_in_kernel", "bool"),
    ("state_v_first", "bool"),
)
GDN_GRADS = ("q", "k", "v", "g", "beta", "initial_state")


@dataclass(frozen=True)
class LibraryOp:
    """One custom op: its arguments (name, schema type; `Tensor(a!)` marks a pool written in place),
    how many tensors it returns, the arguments that get gradients (none: inference only), and how the
    public op's result maps to the custom op's outputs and back."""

    name: str
    public: str
    args: tuple[tuple[str, str], ...]
    outputs: int
    grads: tuple[str, ...] = ()
    fake: Callable[[dict[str, Any]], tuple[torch.Tensor, ...]] | None = None

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.args]

    @property
    def mutates(self) -> tuple[str, ...]:
        return tuple(name for name, kind in self.args if "!" in kind)

    def schema(self) -> str:
        args = ", ".join(f"{kind} {name}" for name, kind in self.args)
        returns = "Tensor" if self.outputs == 1 else "(" + ", ".join(["Tensor"] * self.outputs) + ")"
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


def _gdn_fake(op: str) -> Callable[[dict[str, Any]], tuple[torch.Tensor, ...]]:
    def fake(values: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        shapes = _validated(op, values).shapes
        v = values["v"]
        o = v.new_empty(shapes.B, shapes.T, shapes.HV, shapes.V)
        if not values["output_final_state"]:
            return o, _empty(v)
        inner = (shapes.V, shapes.K) if values["state_v_first"] else (shapes.K, shapes.V)
        return o, v.new_empty(shapes.N, shapes.HV, *inner, dtype=torch.float32)

    return fake


def _like_first(op: str, name: str) -> Callable[[dict[str, Any]], tuple[torch.Tensor, ...]]:
    def fake(values: dict[str, Any]) -> tuple[torch.Tensor, ...]:
        _validated(op, values)
        return (torch.empty_like(values[name], memory_format=torch.contiguous_format),)

    return fake


def _conv_fake(values: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    _validated("causal_conv1d_fn", values)
    x, weight = values["x"], values["weight"]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if not values["return_final_states"]:
        return out, _empty(x)
    return out, x.new_empty(x.shape[0], x.shape[1], weight.shape[1] - 1)


def _gating_fake(values: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    _validated("fused_gdn_gating", values)
    a, b = values["a"], values["b"]
    return a.new_empty(a.shape, dtype=torch.float32), b.new_empty(b.shape)


OPS = (
    LibraryOp(
        "chunk_gated_delta_rule", "chunk_gated_delta_rule", GDN_ARGS, 2, GDN_GRADS, _gdn_fake("chunk_gated_delta_rule")
    ),
    LibraryOp(
        "fused_recurrent_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        GDN_ARGS,
        2,
        GDN_GRADS,
        _gdn_fake("fused_recurrent_gated_delta_rule"),
    ),
    LibraryOp(
        "fused_recurrent_gated_delta_rule_update",
        "fused_recurrent_gated_delta_rule_update",
        (
            *GDN_ARGS[:5],
            ("ssm_pool", "Tensor(a!)"),
            ("ssm_indices", "Tensor"),
            ("scale", "float?"),
            ("cu_seqlens", "Tensor?"),
            ("use_qk_l2norm_in_kernel", "bool"),
            ("state_v_first", "bool"),
        ),
        1,
        fake=_like_first("fused_recurrent_gated_delta_rule_update", "v"),
    ),
    LibraryOp(
        "causal_conv1d_fn",
        "causal_conv1d_fn",
        (
            ("x", "Tensor"),
            ("weight", "Tensor"),
            ("bias", "Tensor?"),
            ("activation", "str?"),
            ("seq_idx", "Tensor?"),
            ("initial_states", "Tensor?"),
            ("return_final_states", "bool"),
        ),
        2,
        ("x", "weight", "bias", "initial_states"),
        _conv_fake,
    ),
    # the varlen form writes its conv-state pool: an inference op of its own (no autograd with a mutation)
    LibraryOp(
        "causal_conv1d_fn_varlen",
        "causal_conv1d_fn",
        (
            ("x", "Tensor"),
            ("weight", "Tensor"),
            ("bias", "Tensor?"),
            ("activation", "str?"),
            ("query_start_loc", "Tensor"),
            ("conv_states", "Tensor(a!)?"),
            ("cache_indices", "Tensor?"),
            ("has_initial_state", "Tensor?"),
        ),
        1,
        fake=_like_first("causal_conv1d_fn", "x"),
    ),
    LibraryOp(
        "causal_conv1d_update",
        "causal_conv1d_update",
        (
            ("x", "Tensor"),
            ("conv_state", "Tensor(a!)"),
            ("weight", "Tensor"),
            ("bias", "Tensor?"),
            ("activation", "str?"),
            ("conv_state_indices", "Tensor?"),
        ),
        1,
        fake=_like_first("causal_conv1d_update", "x"),
    ),
    LibraryOp("l2norm", "l2norm", (("x", "Tensor"), ("eps", "float")), 1, ("x",), _like_first("l2norm", "x")),
    LibraryOp(
        "fused_gdn_gating",
        "fused_gdn_gating",
        (("A_log", "Tensor"), ("a", "Tensor"), ("b", "Tensor"), ("dt_bias", "Tensor")),
        2,
        ("A_log", "a", "b", "dt_bias"),
        _gating_fake,
    ),
)
BY_NAME = {op.name: op for op in OPS}


def _forward(op: LibraryOp) -> Callable:
    # the leading tensors of an op with prepared steps go by position, the way its steps take them
    # (gdn.prepared), so that a compiled decode loop's calls run the prepared step as eager ones do
    width = STEP_TENSORS.get(op.public, 0)

    def impl(*args):
        options = dict(zip(op.names[width:], args[width:], strict=True))
        return _as_outputs(run_op(op.public, args[:width], options), op.outputs)

    return impl


def _backward(op: LibraryOp) -> Callable:
    def impl(*args):
        *inputs, grads = args
        values = dict(zip(op.names, inputs, strict=True))
        leaves = {n: values[n].detach().requires_grad_() for n in op.grads if values[n] is not None}
        with _autograd_inside_an_op():
            outputs = _as_outputs(run_op(op.public, (), {**values, **leaves}), op.outputs)
        outputs = (outputs,) if op.outputs == 1 else outputs
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
    outputs = op.fake(dict(zip(op.names, args, strict=True)))
    return outputs if op.outputs > 1 else outputs[0]


CUSTOM = {op.name: _register(op) for op in OPS}


@dataclass(frozen=True)
class Binding:
    """How a public op's arguments map onto its custom op: the positional names and every default of
    the public signature, plus the public arguments the custom op has no place for (peer features gdn
    refuses unless they hold their defaults)."""

    positional: tuple[str, ...]
    names: frozenset[str]
    defaults: dict[str, Any]
    extras: tuple[str, ...]


def _binding(public: str, ops: Sequence[LibraryOp]) -> Binding:
    parameters = inspect.signature(PREPARE[public]).parameters.values()
    covered = {name for op in ops for name in op.names}
    return Binding(
        positional=tuple(positional_names(PREPARE[public])),
        names=frozenset(p.name for p in parameters),
        defaults={p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty},
        extras=tuple(p.name for p in parameters if p.name not in covered),
    )


BINDINGS = {public: _binding(public, [op for op in OPS if op.public == public]) for public in PREPARE}


def call(public: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The public op `public` through its custom op, as a compiled region runs it. A call that sets an
    argument the custom op does not carry (a refused peer feature) or that is malformed is validated
    like outside a graph, which raises the op's own error."""
    binding = BINDINGS[public]
    values = dict(binding.defaults)
    values.update(zip(binding.positional, args, strict=False))  # fewer positionals than names: the rest by keyword
    values.update(kwargs)
    malformed = len(args) > len(binding.positional) or not binding.names.issuperset(kwargs)
    if malformed or any(values.get(n) is not binding.defaults.get(n) for n in binding.extras):
        PREPARE[public](*args, **kwargs)
    scale = values.get("scale")
    if scale is not None and type(scale) is not float:
        values["scale"] = _given_scale(public, scale)
    op = _library_op(public, values)
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


def _library_op(public: str, values: dict[str, Any]) -> LibraryOp:
    if public == "causal_conv1d_fn" and values.get("query_start_loc") is not None:
        return BY_NAME["causal_conv1d_fn_varlen"]
    return BY_NAME[public]


def _public_result(op: LibraryOp, values: dict[str, Any], outputs: Any) -> Any:
    if op.public in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        o, final = outputs
        return o, final if values["output_final_state"] else None
    if op.name == "causal_conv1d_fn":
        out, final = outputs
        return (out, final) if values["return_final_states"] else out
    return outputs
