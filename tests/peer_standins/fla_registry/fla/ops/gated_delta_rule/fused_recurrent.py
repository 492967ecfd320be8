"""Stand-in: fla 0.6.0's recurrent op, computing with gdn's eager op."""

from gdn.backends.eager import EAGER
from gdn.calls import PREPARE


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    **kwargs,
):
    call = PREPARE["fused_recurrent_gated_delta_rule"](
        q,
        k,
        v,
        g,
        beta=beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
    return EAGER.ops["fused_recurrent_gated_delta_rule"](call)
