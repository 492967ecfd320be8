"""Stand-in: fla 0.6.0's chunk op, dispatched by its registry as fla's is (`@dispatch('gated_delta_rule')`:
FlashQLA's backend takes the calls its verifier accepts). Its own function computes with gdn's eager op,
and its backward hands the gate's gradient to the dispatched `common.chunk_bwd_dqkwg`, where fla's
backward computes dq, dk, dw and dg: so which backend serves that sub-function decides dg, as in fla."""

import torch

from fla.backends import dispatch
from fla.ops.common.chunk_o import chunk_bwd_dqkwg
from gdn.backends.eager import EAGER
from gdn.calls import PREPARE


class _GateGradient(torch.autograd.Function):
    """The identity on g, whose backward sends dg through chunk_bwd_dqkwg."""

    @staticmethod
    def forward(ctx, g, q, k, v, scale):
        ctx.save_for_backward(q, k, v)
        ctx.scale = scale
        return g.view_as(g)

    @staticmethod
    def backward(ctx, dg):
        q, k, v = ctx.saved_tensors
        # fla keeps h and dh in the inputs' dtype (k.new_empty), which TileLang's verifier reads
        h = dh = k.new_empty(0)
        _, _, _, dg = chunk_bwd_dqkwg(q=q, k=k, v=v, do=dg, h=h, dh=dh, g=dg, scale=ctx.scale, dg=dg)
        return dg, None, None, None, None


@dispatch("gated_delta_rule")
def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    **kwargs,
):
    g = _GateGradient.apply(g, q.detach(), k.detach(), v.detach(), scale)
    call = PREPARE["chunk_gated_delta_rule"](
        q,
        k,
        v,
        g,
        beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )
    return EAGER.ops["chunk_gated_delta_rule"](call)
