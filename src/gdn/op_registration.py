"""An op added beside the built-in ones, from one place: its spec (gdn.op_specs.OpSpec), the build that
validates a call's bound arguments and makes its call (gdn.calls), its eager implementation and its
numeric probe's cases. It then takes the paths a built-in op takes: bound and validated
(gdn.calls.PREPARE), resolved per device and compute mode with eager as its fallback and oracle
(gdn.resolve), and inside torch.compile its custom ops with their fakes and autograd (gdn.library).
Other backends serve it where their op tables name it, after their numeric probe where they need one.
(A prepared step, gdn.prepared, is the built-in pool decode's alone.)"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from gdn import calls, library, op_specs, resolve
from gdn.backends.eager import EAGER
from gdn.op_specs import OpSpec
from gdn.ops import _public
from gdn.probe_cases import CASES, Case


def register_op(
    spec: OpSpec,
    build: calls.Build,
    eager: Callable,
    probe_cases: Callable[[torch.Generator], Iterable[Case]] | None = None,
) -> Callable:
    """Add the op `spec` declares; returns its public function (the signature, name and docstring of
    `build`'s op). `eager(call)` computes it from the call `build` makes, in plain PyTorch.
    `probe_cases(generator)`: the inputs (random, from the generator) on which a backend that needs a
    numeric probe is compared with eager before it serves the op; without them only backends that need
    no probe serve it."""
    op_specs.register(spec)  # first: an op's name is taken once
    prepare = calls.define(spec, build)
    library.register(spec)
    EAGER.ops[spec.name] = eager
    if probe_cases is not None:
        CASES[spec.name] = lambda generator, _asking_class: probe_cases(generator)
    return _public(prepare)


def unregister_op(name: str) -> None:
    """Remove an op register_op added (its public function is not to be called again), and forget
    every decision the resolver made, as unregistering a backend does."""
    spec = op_specs.unregister(name)
    del calls.PREPARE[name]
    library.unregister(spec)
    del EAGER.ops[name]
    CASES.pop(name, None)
    resolve.reset()
