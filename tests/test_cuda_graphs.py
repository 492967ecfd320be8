"""CUDA graphs: a decode step (conv update, pool decode) and a dense prefill (chunk op forward) captured
once and replayed with new inputs copied into the captured tensors give what the same calls give
outside a graph, pools included. Packed prefill (cu_seqlens) is not capturable: its launch grid
follows the sequence lengths, which the chunk op reads on the host."""

from __future__ import annotations

import pytest
import torch

import gdn
from compile_cases import HV, B, H, K, T, V, decode_inputs, decode_step
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
