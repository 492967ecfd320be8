"""The GDN ops as users call them, and the pool decode step a serving loop prepares once
(PreparedPoolDecode). Outside a compiled graph a call takes its prepared step where it repeats an
earlier call's metadata (gdn.prepared), else validates its inputs (gdn.calls) and runs the backend that
`gdn.resolve` chose for (op, device) (gdn.dispatch); the checks that read tensor values on the host run
only where the serving kernel does not guard those values itself. Inside a torch.compile region each op
is one custom op (gdn.library), so the region has no graph break and the backend is still chosen when
the op runs."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from gdn import calls, library
from gdn.dispatch import serve
from gdn.kernel_log import record_route
from gdn.op_specs import BY_NAME
from gdn.prepared import run_op
from gdn.tensor_metadata import SameMetadata, metadata


def _public(prepare: Callable[..., calls.Call]) -> Callable:
    """The public op over `prepare` (gdn.calls): its signature, name and docstring. A call is bound to
    its arguments where it is validated (a call that cannot bind raises the TypeError of its op)."""
    name = prepare.__name__

    @functools.wraps(prepare)
    def run(*args, **kwargs):
        if torch.compiler.is_compiling():
            return library.call(name, args, kwargs)
        return run_op(name, args, kwargs)

    return run


# every built-in op's public function, named like the op (gdn exports them by gdn.op_names)
PUBLIC = {spec.name: _public(calls.PREPARE[spec.name]) for spec in calls.SPECS}
globals().update(PUBLIC)


# A decode step prepared once: `fused_recurrent_gated_delta_rule_update` validated and resolved for one
# batch composition, then called every token with that token's tensors. The public call finds its own
# prepared step for such a call (gdn.prepared), after reading the metadata, the options, the environment
# and the resolver's decision again each call; a PreparedPoolDecode holds the pool and the options,
# compares its tensors' metadata with the prepared call's in one pass and hands them to the serving
# implementation's own prepared step, where it offers one and checks the index values on the device
# (the triton kernel); otherwise it makes the public call in full. Either way a step is checked as much
# as the public call: metadata equal to a validated call's, values checked by the kernel or on the host
# as the public call would.
OP = "fused_recurrent_gated_delta_rule_update"
_SPEC = BY_NAME[OP]
# what a step takes, in its order: the step's tensors but the pool; the pool and the options are the
# prepared call's
STEP_ARGUMENTS = tuple(name for name in _SPEC.names[: _SPEC.step_tensors] if name not in _SPEC.mutates)


def _wants_grad(tensors: tuple) -> bool:
    return any(t.requires_grad for t in tensors)


class PreparedPoolDecode:
    """`fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, ssm_pool, ssm_indices, scale,
    cu_seqlens, use_qk_l2norm_in_kernel, *, state_v_first)` prepared from one call's arguments (validated, resolved and,
    where the backend guards the values, value-checked as the public call is); then
    `step(q, k, v, g, beta, ssm_indices) -> o` for each token, on the prepared pool with the prepared
    options. A step's tensors must match the prepared ones in type, shape, dtype, device and strides
    (else ValueError naming the argument: prepare another step for another batch). The backend is the
    one resolved when preparing (`route` says which); `GDN_VALUE_CHECKS=1` when preparing, a backend
    whose kernel does not check the indices, or a torch.compile region make every step the public call,
    and so does a step whose tensors need gradients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        served = serve(OP, args, kwargs, prepare=True, runs=False)
        arguments = _SPEC.bind(args, kwargs)
        self.route: str = served.route or served.backend
        self._pool = arguments["ssm_pool"]
        self._options = {name: arguments[name] for name in _SPEC.names[_SPEC.step_tensors :]}
        self._same = SameMetadata(tuple(arguments[name] for name in STEP_ARGUMENTS))
        self._step: Callable[..., torch.Tensor] | None = served.step
        # the public op under its name in this module when the step is prepared, as a caller reaches it
        self._public: Callable[..., torch.Tensor] = globals()[OP]

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        ssm_indices: torch.Tensor,
    ) -> torch.Tensor:
        tensors = (q, k, v, g, beta, ssm_indices)
        if not self._same(*tensors):
            self._refuse(metadata(tensors))  # unless only what torch's guard reads besides differs
        if self._step is None or torch.compiler.is_compiling() or (torch.is_grad_enabled() and _wants_grad(tensors)):
            return self._public(q, k, v, g, beta, self._pool, ssm_indices, **self._options)
        record_route(self.route, OP, q.dtype)
        return self._step(q, k, v, g, beta, self._pool, ssm_indices)

    __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *_SPEC.signature().parameters.values()],
        return_annotation="None",
    )

    def _refuse(self, found: tuple) -> None:
        for name, got, prepared in zip(STEP_ARGUMENTS, found, self._same.metadata, strict=True):
            if got == prepared:
                continue
            if len(got) == 1:
                raise TypeError(
                    f"PreparedPoolDecode: argument '{name}' expected a tensor ({_describe(prepared)}), "
                    f"got {got[0].__name__}"
                )
            raise ValueError(
                f"PreparedPoolDecode: argument '{name}' expected {_describe(prepared)} (as prepared), got "
                f"{_describe(got)}; prepare a step for other metadata"
            )


def _describe(metadata: tuple) -> str:
    kind, shape, dtype, device, strides = metadata
    return f"type {kind.__name__}, shape {list(shape)}, dtype {dtype}, device {device}, strides {strides}"
