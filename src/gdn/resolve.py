"""Which backend serves each op on each device: `gdn_compute_mode`, the backend registry, numeric
probes, fallback, strict mode, and a record of every decision.

Resolution happens once per (op, device type, mode) per process and is cached; each decision is
logged once. In `auto` mode the candidates are the registered backends that rank the device type,
in rank order, eager last. An explicit mode tries that backend, then eager. A non-eager candidate
must pass its numeric probe against eager before it is chosen. With GDN_STRICT=1 a requested
backend that cannot serve (or, in auto mode, an available backend that fails its probe) raises
GdnBackendError with the real cause instead of falling back.

A chosen backend may still refuse one call (`Backend.refusal`: a shape or gradient its kernels
cannot take): that call is served by the next candidate, decided the same way on the first refusal,
and the reason is counted in the op's record; GDN_STRICT=1 raises with the reason instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from gdn import env_vars, kernel_log, numeric_probe
from gdn.backends.base import Backend
from gdn.calls import Call
from gdn.errors import STRICT_ENV, GdnBackendError, strict
from gdn.kernel_log import last_route as last_route  # where the route of a thread's latest call is read

log = logging.getLogger("gdn")

AUTO = "auto"
EAGER = "eager"
MODE_ENV = "GDN_COMPUTE_MODE"


@dataclass
class Rejection:
    backend: str
    route: str | None
    reason: str
    probe: dict[str, Any] | None = None


@dataclass
class Resolution:
    op: str
    device: str
    requested_mode: str
    backend: str
    route: str
    strict: bool
    rejected: list[Rejection] = field(default_factory=list)
    probe: dict[str, Any] | None = None
    forward_only: bool = False
    fn: Callable | None = field(default=None, repr=False)
    # what serves the calls that need gradients where the backend serves the op forward only: eager's
    # route and implementation, taken when deciding
    training: tuple[str, Callable] | None = field(default=None, repr=False)
    # what serves the calls this backend refuses: the candidates after it, decided on the first refusal
    refusals: Counter[str] = field(default_factory=Counter)
    remaining: list[Backend] = field(default_factory=list, repr=False)
    where: torch.device | None = field(default=None, repr=False)
    fallback: Resolution | None = field(default=None, repr=False)
    # the registered backends that were never tried, and why: {"backend", "reason"}
    not_candidates: list[dict[str, str]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "device": self.device,
            "requested_mode": self.requested_mode,
            "backend": self.backend,
            "route": self.route,
            "strict": self.strict,
            "probe": self.probe,
            "forward_only": self.forward_only,
            "rejected": [vars(r) for r in self.rejected],
            "not_candidates": self.not_candidates,
            "refusals": [
                {"reason": reason, "count": count, "served_by": self.fallback.route if self.fallback else None}
                for reason, count in self.refusals.items()
            ],
        }

    def serve(self, call: Call) -> Served:
        """What serves one validated call (gdn.calls.Call): this resolution's backend; the next
        candidate's when the backend refuses the call; eager when the call needs gradients and the
        backend serves the op forward only (logged once per op, device and backend). The caller runs the
        host value checks the serving kernel does not guard, then records the route (gdn.dispatch)."""
        res = self
        passed_over: list[tuple[str, str]] = []
        reason = _registry()[res.backend].refusal(res.op, call)
        while reason is not None:
            passed_over.append((res.backend, reason))
            res = _refused(res, reason, call)
            reason = _registry()[res.backend].refusal(res.op, call)
        backend, route, fn = res.backend, res.route, res.fn
        if res.training is not None and torch.is_grad_enabled() and any(t.requires_grad for t in call.tensors()):
            key = (res.op, res.device, res.backend)
            with _lock:
                if key not in _training_fallbacks:
                    _training_fallbacks.add(key)
                    log.info(
                        f"gdn: {res.op} on {res.device}: {route} is forward-only; calls that need gradients run eager"
                    )
            passed_over.append((res.backend, "serves the op forward only and the call needs gradients"))
            backend, (route, fn) = EAGER, res.training
        serving = _registry()[backend]
        guards, trusts = res.op in serving.guards_values, res.op in serving.trusts_values
        return Served(call, backend, route, fn, self, guards, trusts, tuple(passed_over))


@dataclass(slots=True)
class Served:
    """A validated call, the backend and route that serve it, its implementation, the resolution it came
    from, whether that backend's kernel guards the values the host value checks read or takes them
    unchecked (Backend.guards_values, Backend.trusts_values), and the candidates that passed the call on
    and why; and the implementation's prepared step for the calls that repeat this one's metadata, where
    gdn.dispatch was asked for it and there is one."""

    call: Call
    backend: str
    route: str
    fn: Callable
    resolution: Resolution
    kernel_guards: bool
    kernel_trusts: bool
    passed_over: kernel_log.PassedOver
    step: Callable | None = None

    def run(self) -> Any:
        """The implementation's result for the call, as the public op returns it."""
        return self.call.public_result(self.fn(self.call))


_lock = threading.RLock()
_backends: dict[str, Backend] = {}
_builtins_loaded = False
_cache: dict[tuple[str, str, str], Resolution] = {}
_mode_override: str | None = None
_scoped_mode: contextvars.ContextVar[str | None] = contextvars.ContextVar("gdn_scoped_compute_mode", default=None)


def _registry() -> dict[str, Backend]:
    global _builtins_loaded
    if _builtins_loaded:  # every op call reads the registry: once loaded, without the lock
        return _backends
    with _lock:
        if not _builtins_loaded:
            from gdn.backends import builtin_backends

            for backend in builtin_backends():
                _backends.setdefault(backend.name, backend)
            _builtins_loaded = True  # last: a reader without the lock sees the whole registry or none
        return _backends


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    _registry()
    with _lock:
        if backend.name in _backends and not replace:
            raise ValueError(f"register_backend: a backend named '{backend.name}' is already registered")
        if backend.name == AUTO:
            raise ValueError(f"register_backend: '{AUTO}' is a mode, not a backend name")
        _backends[backend.name] = backend
        _cache.clear()


def unregister_backend(name: str) -> None:
    _registry()
    with _lock:
        if name == EAGER:
            raise ValueError("unregister_backend: the eager backend is the fallback and cannot be removed")
        _backends.pop(name, None)
        _cache.clear()


def backends() -> dict[str, Backend]:
    return dict(_registry())


def modes() -> list[str]:
    return [AUTO, *backends()]


def _check_mode(mode: str, source: str) -> str:
    if mode != AUTO and mode not in _registry():
        raise ValueError(f"{source}: expected one of {modes()}, got {mode!r}")
    return mode


def set_compute_mode(mode: str | None) -> None:
    """Set gdn_compute_mode for this process; None returns to GDN_COMPUTE_MODE (default auto)."""
    global _mode_override
    with _lock:
        _mode_override = None if mode is None else _check_mode(mode, "set_compute_mode: argument 'mode'")


@contextlib.contextmanager
def compute_mode_override(mode: str) -> Iterator[None]:
    """Within the block, in this thread or asyncio task only, ops resolve under `mode` whatever the
    process-wide mode is (an integration uses it to give its call sites their own mode)."""
    token = _scoped_mode.set(_check_mode(mode, "compute_mode_override: argument 'mode'"))
    try:
        yield
    finally:
        _scoped_mode.reset(token)


def compute_mode() -> str:
    scoped = _scoped_mode.get()
    if scoped is not None:
        return _check_mode(scoped, "compute_mode_override (the backend it named was unregistered)")
    if _mode_override is not None:
        return _check_mode(_mode_override, "set_compute_mode (the backend it named was unregistered)")
    return _check_mode(env_vars.read(MODE_ENV, AUTO) or AUTO, f"environment variable {MODE_ENV}")


def _candidates(op: str, device_type: str, mode: str) -> list[Backend]:
    registry = _registry()
    if mode == EAGER:
        return [registry[EAGER]]
    if mode != AUTO:
        return [registry[mode], registry[EAGER]]
    ranked = [b for b in registry.values() if device_type in b.auto_rank and b.name != EAGER]
    ranked.sort(key=lambda b: b.auto_rank[device_type])
    return [*ranked, registry[EAGER]]


def _not_candidates(device_type: str, mode: str, candidates: list[Backend]) -> list[dict[str, str]]:
    """Why each registered backend outside `candidates` was never tried, from what the registry knows
    without loading any backend: the mode asked for another, or auto does not try it on this device."""
    tried = {b.name for b in candidates}
    passed_over = []
    for backend in _registry().values():
        if backend.name in tried:
            continue
        if mode != AUTO:
            reason = f"not requested: compute mode {mode}"
        elif device_type not in backend.devices:
            reason = f"serves {', '.join(backend.devices)}, not {device_type}"
        else:
            ranked = ", ".join(backend.auto_rank) or "no device"
            reason = f"auto tries it on {ranked} only; {MODE_ENV}={backend.name} selects it"
        passed_over.append({"backend": backend.name, "reason": reason})
    return passed_over


def _decide(op: str, device: torch.device, mode: str, candidates: list[Backend], like: Call | None) -> Resolution:
    device_type = device.type
    rejected: list[Rejection] = []
    is_strict = strict()
    not_candidates = _not_candidates(device_type, mode, candidates)
    eager = _registry()[EAGER]
    # the reference of every probe, and what serves a forward-only backend's calls that need gradients
    eager_route, eager_fn = eager.route_of(op), eager.implementation(op)
    for position, backend in enumerate(candidates):
        reason = backend.why_unavailable(device_type)
        fn = None if reason else backend.implementation(op)
        if reason is None and fn is None:
            reason = backend.why_op_unavailable(op) or f"does not implement {op}"
        route = None if reason else backend.route_of(op)
        probe = None
        forward_only = op in backend.forward_only
        if reason is None and backend.needs_probe:
            compile_ahead = None if backend.compile_ahead is None else functools.partial(backend.compile_ahead, op)
            with kernel_log.during(f"numeric probe of {backend.name}"):
                report = numeric_probe.probe_op(
                    op,
                    fn,
                    device,
                    backend.probe_tolerance.get(op),
                    with_grad=not forward_only,
                    dtype=backend.probe_dtype,
                    head_dims=backend.probe_head_dims,
                    like=like,
                    refusal=functools.partial(backend.refusal, op),
                    outside_limits=backend.probe_outside_limits,
                    eager=eager_fn,
                    compile_ahead=compile_ahead,
                )
            probe = report.record()
            if not report.passed:
                reason = f"numeric probe failed: {report.reason}"
        if reason is None:
            res = Resolution(op, device_type, mode, backend.name, route, is_strict, rejected, probe, forward_only, fn)
            res.remaining, res.where, res.not_candidates = candidates[position + 1 :], device, not_candidates
            if forward_only:
                res.training = (eager_route, eager_fn)
            return res
        rejected.append(Rejection(backend.name, route, reason, probe))
        if is_strict and (backend.name == mode or (mode == AUTO and probe is not None)):
            raise GdnBackendError(
                f"gdn: {op} on {device_type}: backend '{backend.name}' rejected "
                f"({reason}) and {STRICT_ENV}=1 forbids falling back"
            )
    raise GdnBackendError(
        f"gdn: {op} on {device_type}: no backend can serve it: "
        + "; ".join(f"{r.backend}: {r.reason}" for r in rejected)
    )


def _log_decision(res: Resolution) -> None:
    chosen = f"gdn: {res.op} on {res.device} -> {res.route} (mode={res.requested_mode})"
    if not res.rejected:
        log.info(chosen)
        return
    why = "; ".join(f"{r.backend} rejected: {r.reason}" for r in res.rejected)
    wanted_other = res.requested_mode not in (AUTO, res.backend)
    (log.warning if wanted_other or any(r.probe for r in res.rejected) else log.info)(f"{chosen}; {why}")


def resolve(op: str, device: torch.device | str, like: Call | None = None) -> Resolution:
    """The decision for (op, device type, compute mode), made on the first ask and cached. `like` is
    the call that asks (gdn.dispatch passes it): the numeric probe runs in its class (dtype, heads,
    head dims), so that the binaries it compiles are the ones that call launches next."""
    if not isinstance(device, torch.device):
        device = torch.device(device)
    mode = compute_mode()
    key = (op, device.type, mode)
    res = _cache.get(key)  # every call of an op asks again: a decision made is read without the lock
    if res is not None:
        return res
    with _lock:
        res = _cache.get(key)
        if res is None:
            candidates = _candidates(op, device.type, mode)
            res = _decide(op, device, mode, candidates, like)
            _cache[key] = res
            _log_decision(res)
        return res


def decided(op: str, device_type: str) -> Resolution | None:
    """The decision resolve() made for (op, device type, compute mode), or None before it has made one
    (nothing is probed here)."""
    return _cache.get((op, device_type, compute_mode()))


_training_fallbacks: set[tuple[str, str, str]] = set()


def _refused(res: Resolution, reason: str, call: Call) -> Resolution:
    """The resolution that serves a call `res`'s backend refused: the next candidate's."""
    if res.strict:
        raise GdnBackendError(
            f"gdn: {res.op} on {res.device}: backend '{res.backend}' refused the call ({reason}) "
            f"and {STRICT_ENV}=1 forbids falling back"
        )
    with _lock:
        first = reason not in res.refusals
        res.refusals[reason] += 1
        if res.fallback is None:
            res.fallback = _decide(res.op, res.where, res.requested_mode, res.remaining, call)
    if first:
        log.warning(
            f"gdn: {res.op} on {res.device}: {res.backend} refused a call ({reason}); {res.fallback.route} serves it"
        )
    return res.fallback


def resolutions() -> list[dict[str, Any]]:
    """Every decision made in this process, as JSON-able records."""
    with _lock:
        return [r.record() for r in _cache.values()]


def reset() -> None:
    """Forget cached decisions (the next call of each op resolves, probes and logs again)."""
    with _lock:
        _cache.clear()
