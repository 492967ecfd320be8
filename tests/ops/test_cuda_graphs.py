"""CUDA graphs: a decode step (conv update, pool decode), a dense prefill and a packed one (chunk op
forward, cu_seqlens) captured once and replayed with new inputs copied into the captured tensors give
what the same calls give outside a graph, pools included. A packed prefill plans its chunks on the
device (its grid an upper bound that reads no value), so a replay may take other sequence lengths."""

from __future__ import annotations

import pytest
import torch

import gdn
from compile_cases import HV, B, H, K, T, V, decode_inputs, decode_step
from gdn.backends.triton._common import cdiv, processors
from gdn.resolve import compute_mode_override
from reference import rel_err

pytestmark = [
    pytest.mark.single_op,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device"),
]


def captured(fn, static: dict[str, torch.Tensor]):
    """fn(**static) captured in a CUDA graph after a warm-up on a side stream (the first call resolves,
    probes and compiles, none of which a capture may do); returns (graph, the captured output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(**{n: t.clone() for n, t in static.items()})
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(**static)
    return graph, out


def replay_equals_eager(fn, static: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor], pools=()) -> None:
    graph, out = captured(fn, static)
    eager = {n: t.clone() for n, t in fresh.items()}
    expected = fn(**eager)
    for name, t in fresh.items():
        static[name].copy_(t)
    graph.replay()
    torch.cuda.synchronize()
    expected = expected if isinstance(expected, tuple) else (expected,)
    out = out if isinstance(out, tuple) else (out,)
    for got, want in zip(out, expected, strict=True):
        if want is not None:
            assert rel_err(got, want) <= 1e-5
    for pool in pools:
        assert rel_err(static[pool], eager[pool]) <= 1e-5, pool


@torch.no_grad()
def test_a_decode_step_replays_with_new_inputs_like_the_eager_call(gen):
    static = decode_inputs("cuda", gen)
    fresh = decode_inputs("cuda", gen)
    replay_equals_eager(decode_step, static, fresh, pools=("conv_state", "pool"))


def prefill(q, k, v, g, beta, h0):
    return gdn.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )


def prefill_inputs(gen: torch.Generator) -> dict[str, torch.Tensor]:
    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).cuda()

    return dict(
        q=randn(B, 4 * T, H, K),
        k=randn(B, 4 * T, H, K),
        v=randn(B, 4 * T, HV, V),
        g=-torch.rand(B, 4 * T, HV, generator=gen).cuda() * 0.5,
        beta=torch.rand(B, 4 * T, HV, generator=gen).cuda(),
        h0=randn(B, HV, K, V, scale=0.1),
    )


@torch.no_grad()
def test_a_dense_prefill_replays_with_new_inputs_like_the_eager_call(gen):
    replay_equals_eager(prefill, prefill_inputs(gen), prefill_inputs(gen))


def packed_prefill(q, k, v, g, beta, h0, cu_seqlens):
    return gdn.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True
    )


def packed_inputs(gen: torch.Generator, N: int, heads: int, bounds: list[int]) -> dict[str, torch.Tensor]:
    T = bounds[-1]

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).cuda()

    return dict(
        q=randn(1, T, 1, 32),
        k=randn(1, T, 1, 32),
        v=randn(1, T, heads, 32),
        g=-torch.rand(1, T, heads, generator=gen).cuda() * 0.5,
        beta=torch.rand(1, T, heads, generator=gen).cuda(),
        h0=randn(N, heads, 32, 32, scale=0.1),
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32).cuda(),
    )


@torch.no_grad()
def test_a_packed_prefill_replays_with_new_lengths_like_the_eager_call(gen):
    """Captured with one set of sequence lengths and replayed with another (the same lengths in another
    order: same N, same T): the plan is made on the device, so the replay serves the new lengths.
    Enough sequences that the state passes do not split them (a split reads the plan back to the host:
    gdn.backends.triton.chunk._plan)."""
    heads = 4
    N = cdiv(3 * processors(torch.device("cuda")), 8 * heads) + 1  # config.could_split's bound, passed
    lengths = torch.randint(1, 200, (N,), generator=gen)
    lengths[0], lengths[-1] = 64, 1  # a whole chunk, one token
    static = [0, *lengths.cumsum(0).tolist()]
    fresh = [0, *lengths[torch.randperm(N, generator=gen)].cumsum(0).tolist()]
    with compute_mode_override("triton"):
        replay_equals_eager(packed_prefill, packed_inputs(gen, N, heads, static), packed_inputs(gen, N, heads, fresh))


@torch.no_grad()
def test_a_packed_prefill_of_few_sequences_is_captured_whole(gen):
    """Few sequences of few heads, where the state passes split a call's sequences outside a capture (the
    split reads the plan back to the host): captured, the call keeps its sequences whole, and replays
    with new lengths like the eager call."""
    from gdn.backends.triton import chunk as triton_chunk
    from gdn.calls import PREPARE

    heads, N = 4, 2
    static, fresh = [0, 900, 1000], [0, 130, 1000]
    given = packed_inputs(gen, N, heads, static)
    call = PREPARE["chunk_gated_delta_rule"](
        *(given[name] for name in ("q", "k", "v", "g", "beta")), cu_seqlens=given["cu_seqlens"]
    )
    assert triton_chunk._plan(call).split is not None, "outside a capture these sequences split"
    with compute_mode_override("triton"):
        replay_equals_eager(packed_prefill, packed_inputs(gen, N, heads, static), packed_inputs(gen, N, heads, fresh))
