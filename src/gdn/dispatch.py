"""One op call as it runs outside a compiled graph: validate (gdn.calls), take the backend gdn.resolve
chose for (op, device), run the value checks its kernel does not guard, call it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gdn import _validate as check
from gdn.calls import PREPARE, Call
from gdn.resolve import for_call, guards_values, resolve


def serve(name: str, args: tuple, kwargs: dict[str, Any]) -> tuple[Call, str, Callable]:
    """Everything before the kernel: the validated call, the backend that serves it and its
    implementation, the value checks run where that backend's kernel does not guard the values."""
    with check.deferred_value_checks() as value_checks:
        call = PREPARE[name](*args, **kwargs)
    backend, fn = for_call(resolve(name, call.device, call), call)
    check.run_value_checks(value_checks, kernel_guards=guards_values(backend, name))
    return call, backend, fn


def run_op(name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    call, _, fn = serve(name, args, kwargs)
    return fn(call)
