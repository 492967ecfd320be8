"""The built-in backends: each module of this package that declares a backend (gdn.backends.registry).
Backends that need optional packages (triton, fla, flash_qla, torch_npu) load them lazily on first
resolution, so listing them imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gdn.backends.base import Backend


def builtin_backends() -> list[Backend]:
    from gdn.backends.registry import registrations

    return [registration.load() for registration in registrations()]
