"""One op call's full path outside a compiled graph: validate (gdn.calls), take what serves the call
from the decision gdn.resolve made for (op, device), run the value checks its kernel does not guard, and
only then record the route as the one that served the call (gdn.kernel_log): a call those checks refuse
never ran. gdn.prepared remembers the outcome for the calls that repeat one's metadata."""

from __future__ import annotations

from typing import Any

from gdn import _validate as check
from gdn.calls import PREPARE
from gdn.kernel_log import record_route
from gdn.resolve import Served, resolve


def serve(name: str, args: tuple, kwargs: dict[str, Any], *, prepare: bool = False, runs: bool = True) -> Served:
    """Everything before the kernel: the validated call, the backend that serves it and its
    implementation, the value checks run where that backend's kernel does not guard the values, the
    route recorded where the caller runs the call (`runs`; a caller that only prepares steps records
    each step it runs instead). With `prepare`, also the implementation's prepared step for the calls
    that repeat this one's metadata (`Served.step`), where it offers one (`fn.prepare(call)`) and its
    kernel checks the values itself (unless GDN_VALUE_CHECKS=1 asks for the host checks)."""
    with check.deferred_value_checks() as value_checks:
        call = PREPARE[name](*args, **kwargs)
    served = resolve(name, call.device, call).serve(call)
    check.run_value_checks(
        value_checks,
        kernel_guards=served.kernel_guards,
        kernel_trusts=served.kernel_trusts,
        serving=f"{name} on backend '{served.backend}'",
    )
    if prepare and served.kernel_guards and check.value_check_mode() != "1":
        prepared_step = getattr(served.fn, "prepare", None)
        served.step = None if prepared_step is None else prepared_step(call)
    if runs:
        record_route(served.route, name, call.dtype, served.passed_over)
    return served
