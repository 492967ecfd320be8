"""The GDN ops as users call them. Each validates its inputs (gdn.calls), then runs the backend that
`gdn.resolve` chose for (op, device); the checks that read tensor values on the host run only where the
serving kernel does not guard those values itself (gdn._validate.run_value_checks)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from gdn import _validate as check
from gdn import calls
from gdn.resolve import backends, for_call, resolve


def _public(prepare: Callable[..., calls.Call]) -> Callable:
    name = prepare.__name__
    positional = calls.positional_names(prepare)

    @functools.wraps(prepare)
    def run(*args, **kwargs):
        calls.refuse_extra_positionals(name, len(args), positional)
        with check.deferred_value_checks() as value_checks:
            call = prepare(*args, **kwargs)
        backend, fn = for_call(resolve(name, call.device), call)
        check.run_value_checks(value_checks, kernel_guards=name in backends()[backend].guards_values)
        return fn(*call.args, **call.kwargs)

    return run


chunk_gated_delta_rule = _public(calls.chunk_gated_delta_rule)
fused_recurrent_gated_delta_rule = _public(calls.fused_recurrent_gated_delta_rule)
fused_recurrent_gated_delta_rule_update = _public(calls.fused_recurrent_gated_delta_rule_update)
causal_conv1d_fn = _public(calls.causal_conv1d_fn)
causal_conv1d_update = _public(calls.causal_conv1d_update)
l2norm = _public(calls.l2norm)
fused_gdn_gating = _public(calls.fused_gdn_gating)
