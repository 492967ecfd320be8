"""The raw fla_npu ops one route calls, and the names of the ops each gdn op needs.

fla_npu publishes its AscendC ops twice: as `torch.ops.npu.*` dispatcher ops (26.6 registers them
on import; 26.10 only through `fla_npu.load_legacy_torch_ops()`, and only where the wheel ships the
legacy extension), and from 26.10 as plain functions in `fla_npu.ops.ascendc` (the stable API). The
chunk ops take the same arguments on both; the conv entries differ (see conv.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

STABLE = "stable-api"
LEGACY = "legacy-torch-ops"
COMPOSITE = "composite-fwd"


def route_name(route: str) -> str:
    return f"ascendc:{route}"


CHUNK_OPS = (
    "npu_recompute_w_u_fwd",
    "npu_chunk_gated_delta_rule_fwd_h",
    "npu_chunk_fwd_o",
    "npu_chunk_bwd_dv_local",
    "npu_chunk_gated_delta_rule_bwd_dhu",
    "npu_chunk_bwd_dqkwg",
    "npu_prepare_wy_repr_bwd_da",
    "npu_prepare_wy_repr_bwd_full",
)
COMPOSITE_FWD = "npu_chunk_gated_delta_rule_fwd"
RECURRENT = "npu_recurrent_gated_delta_rule"
CONV_FN = "npu_causal_conv1d_fn"  # 26.10: device metadata plus host twins
CONV_RAW = "npu_causal_conv1d"  # host int lists; the only forward entry of the legacy API
CONV_BWD = "npu_causal_conv1d_bwd"


@dataclass(frozen=True)
class RawOps:
    """The ops of one route: `namespace` is fla_npu.ops.ascendc (stable) or torch.ops.npu (legacy)."""

    route: str
    namespace: Any

    def has(self, name: str) -> bool:
        return hasattr(self.namespace, name)

    def missing(self, names: tuple[str, ...]) -> list[str]:
        return [name for name in names if not self.has(name)]

    def get(self, name: str) -> Callable:
        return getattr(self.namespace, name)

    def where(self, name: str) -> str:
        return f"torch.ops.npu.{name}" if self.route == LEGACY else f"fla_npu.ops.ascendc.{name}"
