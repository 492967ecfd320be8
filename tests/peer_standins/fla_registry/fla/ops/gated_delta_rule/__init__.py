"""Stand-in: fla's gated delta rule ops (tests/peer_standins/README.md). Not fla."""

from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule
from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]
