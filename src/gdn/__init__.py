"""gdn: Gated DeltaNet ops with an explicit, probed, observable choice of backend per op.

Names are loaded on first use, so `import gdn` (and `python -m gdn.manifest`) works even where torch
itself is broken: the probe must be able to report that."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gdn.op_names import OP_NAMES  # torch-free

__version__ = "0.1.0"

# each public name and the module that holds it: every op's public function (gdn.ops), then the rest
_EXPORTS = {
    **dict.fromkeys(OP_NAMES, "gdn.ops"),
    "GdnBackendError": "gdn.errors",
    "PreparedPoolDecode": "gdn.ops",
    "compute_mode": "gdn.resolve",
    "modes": "gdn.resolve",
    "register_backend": "gdn.resolve",
    "resolutions": "gdn.resolve",
    "set_compute_mode": "gdn.resolve",
    "unregister_backend": "gdn.resolve",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # re-exports (`as`: __all__ is computed); the ops' functions are typed by their specs
    from gdn.errors import GdnBackendError as GdnBackendError
    from gdn.ops import PreparedPoolDecode as PreparedPoolDecode
    from gdn.resolve import compute_mode as compute_mode
    from gdn.resolve import modes as modes
    from gdn.resolve import register_backend as register_backend
    from gdn.resolve import resolutions as resolutions
    from gdn.resolve import set_compute_mode as set_compute_mode
    from gdn.resolve import unregister_backend as unregister_backend


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gdn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
