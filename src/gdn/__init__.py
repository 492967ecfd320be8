"""gdn: Gated DeltaNet ops with an explicit, probed, observable choice of backend per op.

Names are loaded on first use, so `import gdn` (and `python -m gdn.manifest`) works even where torch
itself is broken: the probe must be able to report that."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "causal_conv1d_fn": "gdn.ops",
    "causal_conv1d_update": "gdn.ops",
    "chunk_gated_delta_rule": "gdn.ops",
    "fused_gdn_gating": "gdn.ops",
    "fused_recurrent_gated_delta_rule": "gdn.ops",
    "fused_recurrent_gated_delta_rule_update": "gdn.ops",
    "l2norm": "gdn.ops",
    "GdnBackendError": "gdn.errors",
    "PreparedPoolDecode": "gdn.ops",
    "compute_mode": "gdn.resolve",
    "modes": "gdn.resolve",
    "register_backend": "gdn.resolve",
    "resolutions": "gdn.resolve",
    "set_compute_mode": "gdn.resolve",
    "unregister_backend": "gdn.resolve",
}
__all__ = [
    "GdnBackendError",
    "PreparedPoolDecode",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "compute_mode",
    "fused_gdn_gating",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_update",
    "l2norm",
    "modes",
    "register_backend",
    "resolutions",
    "set_compute_mode",
    "unregister_backend",
]

if TYPE_CHECKING:
    from gdn.errors import GdnBackendError
    from gdn.ops import (
        PreparedPoolDecode,
        causal_conv1d_fn,
        causal_conv1d_update,
        chunk_gated_delta_rule,
        fused_gdn_gating,
        fused_recurrent_gated_delta_rule,
        fused_recurrent_gated_delta_rule_update,
        l2norm,
    )
    from gdn.resolve import (
        compute_mode,
        modes,
        register_backend,
        resolutions,
        set_compute_mode,
        unregister_backend,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gdn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
