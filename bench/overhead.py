"""The Python overhead of the public ops on the host, with the kernel launch stubbed: a backend whose
implementations return preallocated outputs serves the calls, so what is timed is gdn's own path
(signature check, validation, resolution, value-check policy, the step cache) and nothing of a kernel.

Two calls, as the GPU benchmarks make them: the B = 1 pool decode (`gdn.fused_recurrent_gated_delta_rule_update`
as bench/decode.py's `gdn` row calls it, no_grad, q/k l2norm in the kernel; the stub guards the index
values and offers a prepared step, as the triton kernel does) and the (1, 8192) chunk call (bench/chunk.py's
shape, H = 16, HV = 32, K = V = 128, bf16). Runs on the CPU:

    PYTHONPATH=src python -m bench.overhead [--calls N] [--rounds R]

prints, for each, the µs per call of the median round and of the best (on a loaded machine the best is
the one to compare: load only adds time)."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import gdn
from gdn.backends.base import Backend
from gdn.matrix.timing import chunk_inputs, pool_decode_inputs

POOL_OP = "fused_recurrent_gated_delta_rule_update"
CHUNK_OP = "chunk_gated_delta_rule"
STUB = "launch-stub"
H, HV, K, V = 16, 32, 128, 128


def _stub_backend(pool_out: torch.Tensor, chunk_out: tuple[torch.Tensor, None]) -> Backend:
    def pool_update(call):
        return pool_out

    # the triton pool update's prepared step: taken by repeated calls whose kernel guards the indices
    pool_update.prepare = lambda call: lambda *tensors: pool_out

    def chunk(call):
        return chunk_out

    return Backend(
        STUB,
        ops={POOL_OP: pool_update, CHUNK_OP: chunk},
        devices=("cpu",),
        needs_probe=False,
        guards_values=frozenset({POOL_OP}),
    )


def per_call_us(fn: Callable[[], object], calls: int, rounds: int) -> tuple[float, float]:
    """µs per call: the median round's and the best round's."""
    for _ in range(200):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    (q, k, v, g, beta), pool, indices = pool_decode_inputs(1, H, HV, K, V, device="cpu")
    q1, k1, v1, g1, b1 = (t.detach() for t in chunk_inputs(1, 8192, H, HV, K, device="cpu"))
    gdn.register_backend(_stub_backend(torch.empty_like(v), (torch.empty_like(v1), None)), replace=True)
    gdn.set_compute_mode(STUB)
    try:
        with torch.no_grad():
            decode = per_call_us(
                lambda: gdn.fused_recurrent_gated_delta_rule_update(
                    q, k, v, g, beta, pool, indices, use_qk_l2norm_in_kernel=True
                ),
                args.calls,
                args.rounds,
            )
            chunk = per_call_us(
                lambda: gdn.chunk_gated_delta_rule(q1, k1, v1, g1, b1, use_qk_l2norm_in_kernel=True),
                args.calls,
                args.rounds,
            )
    finally:
        gdn.set_compute_mode(None)
        gdn.unregister_backend(STUB)
    for label, (median, best) in (("pool decode B=1", decode), ("chunk (1, 8192)", chunk)):
        print(f"{label}: {median:.2f} us/call (median), {best:.2f} (best of {args.rounds})")


if __name__ == "__main__":
    main()
