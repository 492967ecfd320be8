"""Stand-in: fla 0.6.0's `common.chunk_bwd_dqkwg`, dispatched by its registry (`@dispatch('common')`:
TileLang's backend takes the calls its verifier accepts). fla's own function (its Triton kernel) is the
identity on the dg the stand-in chunk op hands it."""

from fla.backends import dispatch


@dispatch("common")
def chunk_bwd_dqkwg(q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, scale=None, *, dg):
    return None, None, None, dg
