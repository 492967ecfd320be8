"""One op call as it runs outside a compiled graph: validate (gdn.calls), take the backend gdn.resolve
chose for (op, device), run the value checks its kernel does not guard, call it."""

from __future__ import annotations

from typing import Any

from gdn import _validate as check
from gdn.calls import PREPARE
from gdn.resolve import for_call, guards_values, resolve


def run_op(name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    with check.deferred_value_checks() as value_checks:
        call = PREPARE[name](*args, **kwargs)
    backend, fn = for_call(resolve(name, call.device, call), call)
    check.run_value_checks(value_checks, kernel_guards=guards_values(backend, name))
    return fn(call)
