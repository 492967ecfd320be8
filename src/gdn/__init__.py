"""gdn: Gated DeltaNet ops with an explicit, probed, observable choice of backend per op."""

from gdn.backends.eager import EAGER as _EAGER
from gdn.ops import (
    causal_conv1d_fn,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_gdn_gating,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_update,
    l2norm,
)
from gdn.resolve import (
    GdnBackendError,
    compute_mode,
    modes,
    register_backend,
    resolutions,
    set_compute_mode,
    unregister_backend,
)

register_backend(_EAGER, replace=True)

__version__ = "0.1.0"
__all__ = [
    "GdnBackendError",
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
