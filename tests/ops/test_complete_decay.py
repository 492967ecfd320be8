"""A gate g = -inf is a complete decay (exp(g) = 0: the state before the token is forgotten), a valid
value: every op of every backend here gives the token recurrence's answer for it, forward and
backward, against the fp64 recurrence (tests/reference.py), with -inf gates on a sequence's first
token, inside a chunk, on both sides of a chunk boundary (tokens 63 and 64) and on the last token.
The gradient at a -inf gate is the recurrence's: 0 (exp has slope 0 at -inf).

The chunk kernels form differences of cumulative gates inside a chunk (G_i - G_j), where -inf - -inf
is NaN: before the fix the chunk op gave NaN outputs on eager, triton and the ascendc chain while the
recurrent op stayed finite. Without a CUDA device the triton kernels run under the interpreter."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from gdn.backends.ascendc.chunk import ChunkKernels, make_chunk_gated_delta_rule
from gdn.backends.ascendc.recurrent import make_recurrent_ops
from gdn.backends.eager import EAGER
from gdn.calls import PREPARE
from reference import gdn_recurrence, rel_err
from standins.support import stable

pytestmark = pytest.mark.single_op

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CHUNK = "chunk_gated_delta_rule"
RECURRENT = "fused_recurrent_gated_delta_rule"
POOL = "fused_recurrent_gated_delta_rule_update"
GRADS = ("q", "k", "v", "g", "beta", "initial_state")
T = 150  # chunks of 64, 64 and 22 tokens
# -inf gates per value head: first token, inside the first chunk, both sides of the first chunk
# boundary, inside the last chunk, last token; the other head keeps finite gates but two
COMPLETE = {0: (0, 30, 63, 64, 100, T - 1), 1: (64, 149)}
PACKED = [0, 70, 70, 150]  # a sequence that starts (token 70) and one that is empty


def inputs(gen, *, K=16, V=16, H=1, HV=2, B=1, dtype=torch.float32) -> dict:
    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)

    g = -torch.rand(B, T, HV, generator=gen) * 0.5
    for head, tokens in COMPLETE.items():
        g[:, list(tokens), head] = float("-inf")
    return dict(
        q=randn(B, T, H, K).to(dtype),
        k=randn(B, T, H, K, scale=K**-0.5).to(dtype),
        v=randn(B, T, HV, V).to(dtype),
        g=g.to(DEVICE),
        beta=torch.rand(B, T, HV, generator=gen).to(DEVICE, dtype),
    )


def against_recurrence(
    fn, op: str, gdn: dict, *, cu=None, grads: tuple[str, ...] = GRADS, final_state: bool = True, gen
) -> dict:
    """fn (a backend's implementation of op, taking the validated call) against the fp64 recurrence:
    rel errors of the output, the final state (where asked for) and the gradients in `grads` (random
    upstream gradients on the outputs), and the largest |dg| at a -inf gate."""
    B, _, HV, V = gdn["v"].shape
    K = gdn["q"].shape[-1]
    N = B if cu is None else len(cu) - 1
    h0 = torch.randn(N, HV, K, V, generator=gen) * 0.1
    do = torch.randn(gdn["v"].shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(N, HV, K, V, generator=gen, dtype=torch.float64) * final_state
    given = {**gdn, "initial_state": h0.to(DEVICE)}
    leaves = {n: t.detach().clone().requires_grad_(n in grads) for n, t in given.items()}
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    call = PREPARE[op](**leaves, output_final_state=final_state, cu_seqlens=cu_t, use_qk_l2norm_in_kernel=True)
    with torch.set_grad_enabled(bool(grads)):
        o, final = fn(call)
    ref = {n: t.detach().double().cpu().requires_grad_() for n, t in given.items()}
    ro, rfinal = gdn_recurrence(**ref, cu_seqlens=None if cu is None else torch.tensor(cu), l2norm=True)
    assert o.isfinite().all()
    errors = {"o": rel_err(o, ro)}
    loss = (o.double().cpu() * do).sum()
    if final_state:
        assert final.isfinite().all()
        errors["final_state"] = rel_err(final, rfinal)
        loss = loss + (final.double().cpu() * dht).sum()
    if grads:
        loss.backward()
        ((ro * do).sum() + (rfinal * dht).sum()).backward()
        for n in grads:
            assert leaves[n].grad.isfinite().all(), n
            errors[f"d{n}"] = rel_err(leaves[n].grad, ref[n].grad)
        dg = leaves["g"].grad.cpu()
        errors["|dg| at -inf / ||dg||"] = float(dg[ref["g"].isinf()].abs().max() / ref["g"].grad.norm())
    return errors


def assert_within(errors: dict, tol: float) -> None:
    bad = {name: f"{err:.2e}" for name, err in errors.items() if not err <= tol}
    assert not bad, f"over {tol}: {bad} (all: {errors})"


def _triton(op: str):
    pytest.importorskip("triton")
    from gdn.backends.triton import chunk, decode

    return chunk.chunk_gated_delta_rule if op == CHUNK else getattr(decode, op)


@pytest.mark.parametrize("backend", ["eager", "triton"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("op", [CHUNK, RECURRENT])
def test_complete_decay_gives_the_recurrence(backend, op, packed, gen):
    fn = EAGER.ops[op] if backend == "eager" else _triton(op)
    # the triton recurrent kernel is forward only
    grads = () if (backend, op) == ("triton", RECURRENT) else GRADS
    errors = against_recurrence(
        fn, op, inputs(gen, B=1 if packed else 2), cu=PACKED if packed else None, grads=grads, gen=gen
    )
    assert_within(errors, 1e-4)


@pytest.mark.parametrize("backend", ["eager", "triton"])
def test_complete_decay_through_the_pool(backend, gen):
    """Pool decode over the packed sequences, one slot each, several tokens a call: the pool's rows
    end where the recurrence does."""
    fn = EAGER.ops[POOL] if backend == "eager" else _triton(POOL)
    gdn = inputs(gen)
    HV, K, V = 2, 16, 16
    pool = torch.randn(5, HV, K, V, generator=gen).to(DEVICE) * 0.1
    slots = torch.tensor([3, 0, 4], device=DEVICE)
    before = pool.clone()
    cu = torch.tensor(PACKED, device=DEVICE)
    with torch.no_grad():
        o = fn(PREPARE[POOL](**gdn, ssm_pool=pool, ssm_indices=slots, cu_seqlens=cu, use_qk_l2norm_in_kernel=True))
    ro, rfinal = gdn_recurrence(**gdn, initial_state=before[slots.long()], cu_seqlens=cu, l2norm=True)
    assert o.isfinite().all() and pool.isfinite().all()
    assert rel_err(o, ro) <= 1e-4
    assert rel_err(pool[slots.long()], rfinal) <= 1e-4


def test_complete_decay_through_the_ascendc_adapters(gen):
    """The adapters over the stand-in kernels (which compute the fla_npu ops' contracts, the chunk
    chain from cumulative gates as the real ops do): bf16 kernels, so a bf16 tolerance."""
    ops = stable()
    gdn = inputs(gen, K=128, V=128, B=1)
    chain = make_chunk_gated_delta_rule(ChunkKernels.bind(ops))
    # the route gives the final state forward only (its backward ignores the final state's gradient)
    assert_within(against_recurrence(chain, CHUNK, gdn, cu=PACKED, grads=(), gen=gen), 1.2e-2)
    assert_within(against_recurrence(chain, CHUNK, gdn, cu=PACKED, final_state=False, gen=gen), 3e-2)
    recurrent = make_recurrent_ops(ops.get("npu_recurrent_gated_delta_rule"))[RECURRENT]
    assert_within(against_recurrence(recurrent, RECURRENT, gdn, cu=PACKED, grads=(), gen=gen), 1.2e-2)
