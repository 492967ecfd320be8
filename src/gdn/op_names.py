"""The names of the GDN ops (kept free of torch so that configuration code can read them)."""

OP_NAMES = (
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_update",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "l2norm",
    "fused_gdn_gating",
)
