"""The built-in backends, in registration order. Backends that need optional packages (triton, fla,
flash_qla, torch_npu) load them lazily on first resolution, so listing them imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gdn.backends.base import Backend


def builtin_backends() -> list[Backend]:
    from gdn.backends import ascendc, fla, flashqla, torch_npu_chunk, triton
    from gdn.backends.eager import EAGER

    return [
        EAGER,
        ascendc.ASCENDC,
        triton.make_backend(),
        fla.make_backend(),
        flashqla.make_backend(),
        torch_npu_chunk.make_backend(),
    ]
