"""Which kernel fla itself runs for its chunk op on this machine, read from fla's own backend registry
(fla >= 0.6: `fla.backends`), never guessed from what is installed.

fla's dispatch walks the backends registered for an operation in priority order (lower first) and takes
the first that is available (its package is importable, plus its own capability test), enabled (its
switch, e.g. FLA_FLASH_QLA=0, else its default), accepts the call (its verifier) and implements the
function; when none does, fla's own Triton function runs. This module asks the same questions of the
same objects, with a call shaped like the matrix's benchmark (bf16, K = V = 128, inputs that need
gradients) made of meta tensors, so no kernel runs and nothing is allocated.

It also says whether fla's Hopper guard (its gated chunk_bwd_dqkwg refuses Triton >= 3.4.0 and < 3.7.1
on Hopper) would stop that call's backward here: only when the chunk op stays on fla's Triton path and
fla's `common` registry hands chunk_bwd_dqkwg to no other backend (TileLang, where usable).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gdn.backends.base import describe_error

OPERATION = "gated_delta_rule"
FUNCTION = "chunk_gated_delta_rule"
COMMON = "common"
DQKWG = "chunk_bwd_dqkwg"
FLA_TRITON = "triton"  # fla's own function, what runs when no registered backend takes the call
DISABLE_ENV = "FLA_DISABLE_BACKEND_DISPATCH"
# the shapes the verifiers are asked about: the benchmark's heads, one chunk of tokens
B, T, H, HV, D, NT = 1, 64, 16, 32, 128, 1
CALL_TEXT = f"bf16 q/k/v, fp32 g, B={B} T={T} H={H} HV={HV} K=V={D}, l2norm in kernel, inputs need grad"


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16, grad: bool = False) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def _chunk_call() -> tuple[tuple, dict[str, Any]]:
    q, k = _meta(B, T, H, D, grad=True), _meta(B, T, H, D, grad=True)
    v = _meta(B, T, HV, D, grad=True)
    g = _meta(B, T, HV, dtype=torch.float32, grad=True)
    beta = _meta(B, T, HV, grad=True)
    return (q, k, v, g, beta), {"use_qk_l2norm_in_kernel": True}


def _dqkwg_call() -> tuple[tuple, dict[str, Any]]:
    # as fla's gated delta rule backward calls it: h and dh in the inputs' dtype (k.new_empty)
    return (), {
        "q": _meta(B, T, H, D),
        "k": _meta(B, T, H, D),
        "v": _meta(B, T, HV, D),
        "do": _meta(B, T, HV, D),
        "h": _meta(B, NT, HV, D, D),
        "dh": _meta(B, NT, HV, D, D),
        "w": _meta(B, T, HV, D),
        "g": _meta(B, T, HV, dtype=torch.float32),
        "dv": _meta(B, T, HV, D),
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


def choice(operation: str, function: str, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """fla's candidates for `function` of `operation`, in its order, and the one its dispatch takes."""
    import fla.backends

    disabled = bool(getattr(fla.backends, "_DISPATCH_DISABLED", False))
    candidates = (
        [] if disabled else [_candidate(b, function, args, kwargs) for b in _registry(operation)._get_sorted_backends()]
    )
    chosen = next((c["backend"] for c in candidates if c["accepted"]), FLA_TRITON)
    return {"function": function, "dispatch_disabled": disabled, "candidates": candidates, "chosen": chosen}


def hopper_guard(chunk_chosen: str) -> dict[str, Any]:
    import fla.utils

    flags = {
        name: getattr(fla.utils, name, None)
        for name in ("IS_NVIDIA_HOPPER", "TRITON_ABOVE_3_4_0", "TRITON_ABOVE_3_7_1")
    }
    if None in flags.values():
        return {"present": False, "blocks_gated_backward": False, "detail": "this fla has no Hopper guard"}
    applies = bool(flags["IS_NVIDIA_HOPPER"] and flags["TRITON_ABOVE_3_4_0"] and not flags["TRITON_ABOVE_3_7_1"])
    dqkwg = choice(COMMON, DQKWG, *_dqkwg_call())
    blocks = applies and chunk_chosen == FLA_TRITON and dqkwg["chosen"] == FLA_TRITON
    if not applies:
        detail = "not Hopper with Triton >= 3.4.0 and < 3.7.1"
    elif chunk_chosen != FLA_TRITON:
        detail = f"the chunk op runs on {chunk_chosen}, whose backward is its own"
    elif not blocks:
        detail = f"{DQKWG} runs on {dqkwg['chosen']}"
    else:
        detail = (
            f"Hopper with Triton >= 3.4.0 and < 3.7.1 and {DQKWG} on fla's Triton kernel: the gated backward raises"
        )
    return {"present": True, "applies": applies, "dqkwg": dqkwg, "blocks_gated_backward": blocks, "detail": detail}


def describe() -> dict[str, Any]:
    """fla's choice for its chunk op and the Hopper guard's verdict (fla must import)."""
    section: dict[str, Any] = {"call": CALL_TEXT, "env": {k: v for k, v in os.environ.items() if k.startswith("FLA_")}}
    try:
        section["chunk"] = choice(OPERATION, FUNCTION, *_chunk_call())
    except Exception as exc:  # an fla without the registry (< 0.6) or one that changed it
        section["chunk"] = {"error": describe_error(exc), "chosen": None}
        return section
    try:
        section["hopper_guard"] = hopper_guard(section["chunk"]["chosen"])
    except Exception as exc:
        section["hopper_guard"] = {"error": describe_error(exc)}
    return section
