"""Which kernels fla itself runs for its chunk op on this machine, read from fla's own backend registry
(fla >= 0.6: `fla.backends`), never guessed from what is installed.

fla's dispatch walks the backends registered for an operation in priority order (lower first) and takes
the first that is available (its package is importable, plus its own capability test), enabled (its
switch, e.g. FLA_FLASH_QLA=0, else its default), accepts the call (its verifier) and implements the
function; when none does, fla's own Triton function runs. Verifiers look at the call (FlashQLA's refuses
fp32 inputs; TileLang's chunk_bwd_dqkwg takes fp32 where h is in q's dtype), so this module asks the same
questions of the same objects for a bf16 call (the benchmark's) and an fp32 call (a training step's), for
the chunk op and for the sub-function its backward dispatches again (`common.chunk_bwd_dqkwg`), with
calls shaped like the benchmark's (K = V = 128, inputs that need gradients) made of meta tensors, so no
kernel runs and nothing is allocated.

`watching()` also notes, while it is in force, every dispatch fla's registries make at run time in
gdn's kernel log (gdn.kernel_log), keyed by the call's dtype: what fla really ran for each call, which
a static answer for one call cannot say (an fp32 training step is not the bf16 call asked about here).

It also says whether fla's Hopper guard (its gated chunk_bwd_dqkwg refuses Triton >= 3.4.0 and < 3.7.1
on Hopper) would stop each call's backward here: only when the chunk op stays on fla's Triton path and
fla's `common` registry hands chunk_bwd_dqkwg to no other backend (TileLang, where usable).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gdn import kernel_log
from gdn.backends.base import describe_error

OPERATION = "gated_delta_rule"
FUNCTION = "chunk_gated_delta_rule"
COMMON = "common"
DQKWG = "chunk_bwd_dqkwg"
FLA_TRITON = "triton"  # fla's own function, what runs when no registered backend takes the call
DISABLE_ENV = "FLA_DISABLE_BACKEND_DISPATCH"
LEVEL = "fla"  # the level of fla's own dispatch in gdn's kernel log
# the shapes the verifiers are asked about: the benchmark's heads, one chunk of tokens
B, T, H, HV, D, NT = 1, 64, 16, 32, 128, 1
CALL_TEXT = f"q/k/v/beta in the dtype, fp32 g, B={B} T={T} H={H} HV={HV} K=V={D}, l2norm in kernel, inputs need grad"
# the dtypes asked about: the benchmark's bf16 calls, and the fp32 of a training step such as the grpo family's
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _meta(*shape: int, dtype: torch.dtype, grad: bool = False) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def _chunk_call(dtype: torch.dtype) -> tuple[tuple, dict[str, Any]]:
    q, k = _meta(B, T, H, D, dtype=dtype, grad=True), _meta(B, T, H, D, dtype=dtype, grad=True)
    v = _meta(B, T, HV, D, dtype=dtype, grad=True)
    g = _meta(B, T, HV, dtype=torch.float32, grad=True)
    beta = _meta(B, T, HV, dtype=dtype, grad=True)
    return (q, k, v, g, beta), {"use_qk_l2norm_in_kernel": True}


def _dqkwg_call(dtype: torch.dtype) -> tuple[tuple, dict[str, Any]]:
    # as fla's gated delta rule backward calls it: h and dh in the inputs' dtype (k.new_empty)
    return (), {
        "q": _meta(B, T, H, D, dtype=dtype),
        "k": _meta(B, T, H, D, dtype=dtype),
        "v": _meta(B, T, HV, D, dtype=dtype),
        "do": _meta(B, T, HV, D, dtype=dtype),
        "h": _meta(B, NT, HV, D, D, dtype=dtype),
        "dh": _meta(B, NT, HV, D, D, dtype=dtype),
        "w": _meta(B, T, HV, D, dtype=dtype),
        "g": _meta(B, T, HV, dtype=torch.float32),
        "dv": _meta(B, T, HV, D, dtype=dtype),
    }


def _registry(operation: str) -> Any:
    from fla.backends import dispatch

    # dispatch(<operation name>) loads the operation's backends and returns its registry's decorator,
    # a bound method: its __self__ is the registry fla's dispatch consults.
    return dispatch(operation).__self__


def _candidate(backend: Any, function: str, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "backend": backend.backend_type,
        "priority": backend.priority,
        "package": backend.package_name,
        "env_var": backend.env_var,
        "default_enable": backend.default_enable,
        "available": bool(backend.is_available()),
        "enabled": bool(backend.is_enabled()),
        "accepted": None,
        "reason": None,
    }
    if entry["available"] and entry["enabled"]:
        with torch.enable_grad():
            accepted, reason = backend.verify(function, *args, **kwargs)
        entry["accepted"], entry["reason"] = bool(accepted), reason
        if accepted and backend.get_implementation(function) is None:
            entry["accepted"], entry["reason"] = False, f"implements no {function}"
    return entry


def _sorted_backends(registry: Any) -> list[Any]:
    """The registry's backends in fla's order, as fla's own method gives them (not `watching`'s)."""
    method = type(registry)._get_sorted_backends
    return getattr(method, kernel_log.ORIGINAL, method)(registry)


def choice(operation: str, function: str, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """fla's candidates for `function` of `operation`, in its order, and the one its dispatch takes."""
    import fla.backends

    disabled = bool(getattr(fla.backends, "_DISPATCH_DISABLED", False))
    candidates = (
        [] if disabled else [_candidate(b, function, args, kwargs) for b in _sorted_backends(_registry(operation))]
    )
    chosen = next((c["backend"] for c in candidates if c["accepted"]), FLA_TRITON)
    return {"function": function, "dispatch_disabled": disabled, "candidates": candidates, "chosen": chosen}


def hopper_guard(chunk_chosen: str, dqkwg_chosen: str) -> dict[str, Any]:
    import fla.utils

    flags = {
        name: getattr(fla.utils, name, None)
        for name in ("IS_NVIDIA_HOPPER", "TRITON_ABOVE_3_4_0", "TRITON_ABOVE_3_7_1")
    }
    if None in flags.values():
        return {"present": False, "blocks_gated_backward": False, "detail": "this fla has no Hopper guard"}
    applies = bool(flags["IS_NVIDIA_HOPPER"] and flags["TRITON_ABOVE_3_4_0"] and not flags["TRITON_ABOVE_3_7_1"])
    blocks = applies and chunk_chosen == FLA_TRITON and dqkwg_chosen == FLA_TRITON
    if not applies:
        detail = "not Hopper with Triton >= 3.4.0 and < 3.7.1"
    elif chunk_chosen != FLA_TRITON:
        detail = f"the chunk op runs on {chunk_chosen}, whose backward is its own"
    elif not blocks:
        detail = f"{DQKWG} runs on {dqkwg_chosen}"
    else:
        detail = (
            f"Hopper with Triton >= 3.4.0 and < 3.7.1 and {DQKWG} on fla's Triton kernel: the gated backward raises"
        )
    return {"present": True, "applies": applies, "blocks_gated_backward": blocks, "detail": detail}


def describe_dtype(dtype: torch.dtype) -> dict[str, Any]:
    """For a call in `dtype`: fla's choice for its chunk op, for the chunk_bwd_dqkwg its backward
    dispatches, and the Hopper guard's verdict."""
    chunk = choice(OPERATION, FUNCTION, *_chunk_call(dtype))
    dqkwg = choice(COMMON, DQKWG, *_dqkwg_call(dtype))
    guard = hopper_guard(chunk["chosen"], dqkwg["chosen"])
    return {"chunk": chunk, DQKWG: dqkwg, "hopper_guard": guard}


def describe() -> dict[str, Any]:
    """Per dtype (DTYPES), fla's choices and the Hopper guard's verdict (fla must import)."""
    section: dict[str, Any] = {"call": CALL_TEXT, "env": {k: v for k, v in os.environ.items() if k.startswith("FLA_")}}
    calls: dict[str, Any] = {}
    for name, dtype in DTYPES.items():
        try:
            calls[name] = describe_dtype(dtype)
        except Exception as exc:  # an fla without the registry (< 0.6) or one that changed it
            calls[name] = {"error": describe_error(exc)}
    section["calls"] = calls
    return section


# ---------------------------------------------------------------- what fla dispatches at run time


def _first_dtype(args: tuple, kwargs: dict[str, Any]) -> torch.dtype | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.dtype
    return None


class _Dispatch:
    """One dispatch of fla's registry, as `watching` follows it through fla's own loop: the candidates
    that declined the call, then the one that ran it (a backend, or fla's own function)."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.dtype: torch.dtype | None = None
        self.passed_over: list[tuple[str, str]] = []

    def verified(self, args: tuple, kwargs: dict[str, Any]) -> None:
        if self.dtype is None:
            self.dtype = _first_dtype(args, kwargs)

    def note(self, function: str, ran: str) -> None:
        dtype = self.dtype if self.dtype is not None else torch.float32
        kernel_log.note(LEVEL, f"{self.operation}.{function}", dtype, ran, tuple(self.passed_over))


class _Candidate:
    """A registered backend as fla's dispatch loop sees it, noting why it declines and when it runs."""

    def __init__(self, backend: Any, dispatch: _Dispatch) -> None:
        self._backend = backend
        self._dispatch = dispatch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def verify(self, function_name: str, *args: Any, **kwargs: Any) -> tuple[bool, str | None]:
        self._dispatch.verified(args, kwargs)
        accepted, reason = self._backend.verify(function_name, *args, **kwargs)
        if not accepted:
            self._dispatch.passed_over.append((self._backend.backend_type, str(reason)))
        return accepted, reason

    def get_implementation(self, function_name: str) -> Callable | None:
        implementation = self._backend.get_implementation(function_name)
        backend_type, dispatch = self._backend.backend_type, self._dispatch
        if implementation is None:
            dispatch.passed_over.append((backend_type, f"implements no {function_name}"))
            return None

        def noted(*args: Any, **kwargs: Any) -> Any:
            dispatch.note(function_name, backend_type)
            return implementation(*args, **kwargs)

        return noted


class _OwnFunction:
    """Last in the loop, where fla runs its own function: accepts every call and offers no
    implementation, so fla's loop goes on to its own function exactly as without it."""

    backend_type = FLA_TRITON

    def __init__(self, dispatch: _Dispatch) -> None:
        self._dispatch = dispatch

    def is_available(self) -> bool:
        return True

    def is_enabled(self) -> bool:
        return True

    def verify(self, function_name: str, *args: Any, **kwargs: Any) -> tuple[bool, None]:
        self._dispatch.verified(args, kwargs)
        self._dispatch.note(function_name, FLA_TRITON)
        return True, None

    def get_implementation(self, function_name: str) -> None:
        return None


@contextlib.contextmanager
def watching() -> Iterator[bool]:
    """While the block runs, every dispatch of fla's registries (fla >= 0.6) notes what ran in the kernel
    log in force: `gated_delta_rule.chunk_gated_delta_rule -> flash_qla`, `common.chunk_bwd_dqkwg ->
    tilelang`, with the call's dtype and the backends that declined it. fla's dispatch loop reads its
    candidates from the registry at every call, so the candidates it reads are wrapped (each declining
    or running call noted) and followed by a last one that notes the fall-through to fla's own function;
    what fla runs, and what it logs, is unchanged. Yields whether fla's registry was found (False: fla
    absent, broken, or without a registry; nothing is watched). With FLA_DISABLE_BACKEND_DISPATCH=1 fla
    calls its functions directly and nothing is noted at this level."""
    try:
        import fla.backends as registry_module

        registry_class = registry_module.BackendRegistry
        original = registry_class.__dict__["_get_sorted_backends"]
    except Exception:  # fla absent, failing to import (a broken tilelang), or older than its registry
        original = None
    if original is None or getattr(original, kernel_log.ORIGINAL, None) is not None:  # absent, or watched already
        yield original is not None
        return

    def sorted_backends(registry: Any) -> list[Any]:
        backends = original(registry)
        if kernel_log.ACTIVE is None:
            return backends
        dispatch = _Dispatch(registry.operation_name)
        return [*(_Candidate(b, dispatch) for b in backends), _OwnFunction(dispatch)]

    setattr(sorted_backends, kernel_log.ORIGINAL, original)
    registry_class._get_sorted_backends = sorted_backends
    try:
        yield True
    finally:
        registry_class._get_sorted_backends = original
