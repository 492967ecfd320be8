"""One op call's full path outside a compiled graph: validate (gdn.calls), take the backend gdn.resolve
chose for (op, device) and that serves this call, run the value checks its kernel does not guard.
gdn.prepared remembers the outcome for the calls that repeat one's metadata."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gdn import _validate as check
from gdn.calls import PREPARE, Call
from gdn.resolve import Resolution, guards_values, resolve, trusts_values


@dataclass(slots=True)
class Served:
    """A validated call, the backend and route that serve it, its implementation, the resolution it came
    from and whether that backend's kernel guards the values the host value checks read."""

    call: Call
    backend: str
    route: str
    fn: Callable
    resolution: Resolution
    kernel_guards: bool

    def run(self) -> Any:
        """The implementation's result for the call, as the public op returns it."""
        return self.call.public_result(self.fn(self.call))


def serve(name: str, args: tuple, kwargs: dict[str, Any]) -> Served:
    """Everything before the kernel: the validated call, the backend that serves it and its
    implementation, the value checks run where that backend's kernel does not guard the values."""
    with check.deferred_value_checks() as value_checks:
        call = PREPARE[name](*args, **kwargs)
    resolution = resolve(name, call.device, call)
    backend, route, fn = resolution.serve(call)
    kernel_guards = guards_values(backend, name)
    check.run_value_checks(
        value_checks,
        kernel_guards=kernel_guards,
        kernel_trusts=trusts_values(backend, name),
        serving=f"{name} on backend '{backend}'",
    )
    return Served(call, backend, route, fn, resolution, kernel_guards)
