"""Which fla_npu API generation this process has, and what it exposes after loading.

26.6 registers its ops under torch.ops.npu on import and has no loader. 26.10 ("decoupled") registers
nothing on import: its raw ops are plain functions in fla_npu.ops.ascendc, and the torch.ops.npu ops
come only from `fla_npu.load_legacy_torch_ops()`, which raises FileNotFoundError on wheels that ship
no legacy extension. That is "legacy unavailable", not a failure of the stable API.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any

from gdn.backends.base import describe_error

STABLE_MODULE = "fla_npu.ops.ascendc"
DISTRIBUTIONS = ("flash-linear-attention-npu", "fla-npu", "fla_npu")
# one of the ops fla_npu registers under torch.ops.npu (on import in 26.6)
LEGACY_MARKER_OP = "npu_chunk_gated_delta_rule_fwd_h"
STAND_IN_ATTR = "__gdn_stand_in__"


def generation(has_loader: bool, stable_api: bool, legacy_registered: bool) -> str:
    if has_loader and stable_api:
        return "26.10-stable"
    if not has_loader and legacy_registered:
        return "26.6-legacy"
    return "unknown"


def distribution_version() -> str | None:
    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _legacy_namespace() -> Any:
    import torch

    return torch.ops.npu


def legacy_registered() -> bool:
    return hasattr(_legacy_namespace(), LEGACY_MARKER_OP)


@dataclass
class Surface:
    import_error: str | None = None
    version: str | None = None
    stand_in: str | None = None
    has_loader: bool = False
    legacy: str = "absent"  # how torch.ops.npu came to hold the ops, or why it does not
    legacy_loaded: bool = False
    legacy_ops: Any = None  # torch.ops.npu once it holds fla_npu's ops
    stable: ModuleType | None = None
    stable_reason: str | None = None  # why the stable API is not used
    generation: str = "unknown"

    def record(self) -> dict[str, Any]:
        return {
            "import_error": self.import_error,
            "version": self.version,
            "stand_in": self.stand_in,
            "generation": self.generation,
            "load_legacy_torch_ops": self.has_loader,
            "legacy_torch_ops": self.legacy,
            "legacy_loaded": self.legacy_loaded,
            "stable_api": self.stable is not None,
            "stable_api_reason": self.stable_reason,
        }

    @property
    def summary(self) -> str:
        label = f" [stand-in: {self.stand_in}]" if self.stand_in else ""
        version = self.version or "(no distribution)"
        return f"fla_npu {version}{label}: {self.generation}; legacy torch.ops.npu {self.legacy}"


def _load_legacy(fla_npu: ModuleType, surface: Surface) -> None:
    surface.has_loader = callable(getattr(fla_npu, "load_legacy_torch_ops", None))
    if not surface.has_loader:
        surface.legacy_loaded = legacy_registered()
        surface.legacy = "registered on import" if surface.legacy_loaded else "not registered (no loader either)"
        return
    try:
        fla_npu.load_legacy_torch_ops()
    except FileNotFoundError as exc:  # wheels without the embedded legacy extension
        surface.legacy = f"not shipped: {describe_error(exc)}"
        return
    except Exception as exc:  # the stable API may still serve: a finding, not a failure
        surface.legacy = f"load failed: {describe_error(exc)}"
        return
    surface.legacy_loaded = legacy_registered()
    surface.legacy = "loaded by load_legacy_torch_ops()" if surface.legacy_loaded else "loader ran, ops missing"


def load() -> Surface:
    """Import fla_npu and load what it offers (call once per process: loading registers ops)."""
    surface = Surface(version=distribution_version())
    try:
        fla_npu = importlib.import_module("fla_npu")
    except Exception as exc:  # no CANN env, missing libraries: the reason the backend is unavailable
        surface.import_error = describe_error(exc)
        return surface
    surface.stand_in = getattr(fla_npu, STAND_IN_ATTR, None)
    _load_legacy(fla_npu, surface)
    if surface.has_loader:
        try:
            surface.stable = importlib.import_module(STABLE_MODULE)
        except Exception as exc:
            surface.stable_reason = f"import {STABLE_MODULE} failed: {describe_error(exc)}"
    else:
        surface.stable_reason = (
            "fla_npu has no load_legacy_torch_ops(): a 26.6-style wheel, whose "
            f"{STABLE_MODULE} only forwards to torch.ops.npu"
        )
    surface.generation = generation(surface.has_loader, surface.stable is not None, surface.legacy_loaded)
    if surface.legacy_loaded:
        surface.legacy_ops = _legacy_namespace()
    return surface
