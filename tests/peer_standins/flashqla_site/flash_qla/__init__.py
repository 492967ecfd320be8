"""STAND-IN for flash-qla 0.1.3 (tests/peer_standins/README.md). Not FlashQLA.

Its chunk_gated_delta_rule has FlashQLA's signature and its refusals (asserts on dtype, K = V = 128,
B = 1 with cu_seqlens, a sequence without tokens, an initial state per sequence, an fp32 g where the
gate gets a gradient: the real one asserts its dg is fp32), computes with gdn's eager op
(differentiable) and records every call in CALLS. Its forward asks its chunk module for the split
(flash_qla.ops.gated_delta_rule.chunk), as FlashQLA's does.
"""

import itertools

import torch

from flash_qla.ops.gated_delta_rule import chunk
from gdn.backends.eager import EAGER
from gdn.calls import PREPARE

__gdn_stand_in__ = "flash-qla 0.1.3 computing with gdn eager (adapter test)"
__version__ = "0.1.3"

CALLS = []


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
    head_first=False,
    state_v_first=False,
    auto_cp=True,
    enable_fwd_cp_cache=True,
    cp_context=None,
    force_intra_cp=False,
):
    CALLS.append(dict(locals()))
    assert q.dtype == k.dtype == v.dtype
    assert q.dtype in (torch.bfloat16, torch.float16), "FlashQLA only supports bfloat16 and float16."
    assert q.shape[-1] == v.shape[-1] == 128
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError("The batch size is expected to be 1 when using `cu_seqlens`.")
    if cu_seqlens is None:
        lengths = [q.shape[1]] * q.shape[0]
    else:
        bounds = cu_seqlens.tolist()
        lengths = [end - start for start, end in itertools.pairwise(bounds)]
    chunks = [-(-length // 64) for length in lengths]
    if not chunks or min(chunks) <= 0:
        raise ValueError(f"invalid sequence lengths: {chunks}")
    if initial_state is not None and initial_state.shape[0] != len(chunks):
        raise ValueError("The number of initial states is expected to be equal to the number of input sequences")
    if g.requires_grad:
        assert g.dtype == torch.float32, "dg should be fp32"
    # as FlashQLA's forward decides its split, through its chunk module (what gdn's kernel log watches)
    chunk._auto_intra_cp_context(k, v, cu_seqlens, 64, auto_cp, False, force_intra_cp=force_intra_cp)
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
