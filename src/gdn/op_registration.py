"""An op added beside the built-in ones, from one place: its spec (gdn.op_specs.OpSpec), the build that
validates a call's bound arguments and makes its call (gdn.calls), and its eager implementation. It
then takes every path a built-in op takes: bound and validated (gdn.calls.PREPARE), resolved per device
and compute mode with eager as its fallback and oracle (gdn.resolve), its prepared steps (gdn.prepared)
and, inside torch.compile, its custom ops with their fakes and autograd (gdn.library). Other backends
serve it where their op tables name it."""

from __future__ import annotations

from collections.abc import Callable

from gdn import calls, library, op_specs, resolve
from gdn.backends.eager import EAGER
from gdn.op_specs import OpSpec
from gdn.ops import _public


def register_op(spec: OpSpec, build: calls.Build, eager: Callable) -> Callable:
    """Add the op `spec` declares; returns its public function (the signature, name and docstring of
    `build`'s op). `eager(call)` computes it from the call `build` makes, in plain PyTorch."""
    op_specs.register(spec)  # first: an op's name is taken once
    prepare = calls.define(spec, build)
    library.register(spec)
    EAGER.ops[spec.name] = eager
    return _public(prepare)


def unregister_op(name: str) -> None:
    """Remove an op register_op added (its public function is not to be called again), and forget
    every decision the resolver made, as unregistering a backend does."""
    spec = op_specs.unregister(name)
    del calls.PREPARE[name]
    library.unregister(spec)
    del EAGER.ops[name]
    resolve.reset()
