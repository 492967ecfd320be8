"""The ascendc backend's environment knobs, its kernel dtype rule and its log-once helper."""

from __future__ import annotations

import logging
import os
import threading

import torch

log = logging.getLogger("gdn")

FUSED_FWD_ENV = "GDN_NPU_FUSED_FWD"
# The AscendC GDN and conv kernels take bf16/fp16 only; float32 inputs run in bf16.
KERNEL_DTYPES = (torch.bfloat16, torch.float16)

_logged: set[str] = set()
_lock = threading.Lock()


def log_once(key: str, level: int, message: str) -> None:
    """One line per process for a decision that is taken per call (shape gate, dtype rule)."""
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    log.log(level, message)


def fused_fwd() -> bool | None:
    """GDN_NPU_FUSED_FWD: None when unset (use the composite forward where shipped), else 0 / 1."""
    raw = os.environ.get(FUSED_FWD_ENV, "")
    if raw == "":
        return None
    if raw not in ("0", "1"):
        raise ValueError(
            f"environment variable {FUSED_FWD_ENV}: expected 0 or 1 (unset: the composite forward when "
            f"fla_npu ships it), got {raw!r}"
        )
    return raw == "1"


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype in KERNEL_DTYPES:
        return dtype
    log_once(
        f"dtype:{dtype}",
        logging.INFO,
        f"gdn.ascendc: {dtype} inputs run through the AscendC kernels in bfloat16 (they take bf16/fp16)",
    )
    return torch.bfloat16
