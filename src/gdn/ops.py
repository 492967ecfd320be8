"""The GDN ops as users call them. Each validates its inputs (gdn.calls), then runs the backend that
`gdn.resolve` chose for (op, device) (gdn.dispatch); the checks that read tensor values on the host run
only where the serving kernel does not guard those values itself. Inside a torch.compile region each op
is one custom op (gdn.library), so the region has no graph break and the backend is still chosen when
the op runs."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from gdn import calls, library
from gdn.dispatch import run_op


def _public(prepare: Callable[..., calls.Call]) -> Callable:
    name = prepare.__name__
    positional = calls.positional_names(prepare)

    @functools.wraps(prepare)
    def run(*args, **kwargs):
        calls.refuse_extra_positionals(name, len(args), positional)
        if torch.compiler.is_compiling():
            return library.call(name, args, kwargs)
        return run_op(name, args, kwargs)

    return run


chunk_gated_delta_rule = _public(calls.chunk_gated_delta_rule)
fused_recurrent_gated_delta_rule = _public(calls.fused_recurrent_gated_delta_rule)
fused_recurrent_gated_delta_rule_update = _public(calls.fused_recurrent_gated_delta_rule_update)
causal_conv1d_fn = _public(calls.causal_conv1d_fn)
causal_conv1d_update = _public(calls.causal_conv1d_update)
l2norm = _public(calls.l2norm)
fused_gdn_gating = _public(calls.fused_gdn_gating)
