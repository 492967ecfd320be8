"""The public calls' wall time on the GPU, per source tree: the B = 1 pool decode and the (1, 8192) chunk
call, as bench/overhead.py makes them but with the kernels launched, so that a change to gdn's front
door is timed as a user meets it, host work and launches together.

Each tree (a directory holding a checkout's src/, e.g. an older commit exported with `git archive`) is
timed in child processes of its own, and the trees' children alternate round by round, so that a drift
of the machine falls on every tree alike. A child times, back to back and synchronised only at the end
of each round: the decode (`gdn.fused_recurrent_gated_delta_rule_update`, no_grad, q/k l2norm in the
kernel, an fp32 pool of 2 slots), the chunk forward (no_grad) and the chunk forward+backward
(H = 16, HV = 32, K = V = 128, bf16). The inputs come from this checkout's gdn.matrix.timing, loaded by
its path, so that every tree is handed the same tensors and an older tree needs none of it.

    PYTHONPATH=src:. python -m bench.public_calls --tree before=.trees/bb57733 --tree after=. [--rounds 5]

writes bench/results/public-calls-<date>.json: per tree, each call's µs per call, median over rounds
and every round's value."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALLS = ("decode_b1", "chunk_fwd", "chunk_fwd_bwd")
# calls per round: enough to put each round's wall time well past the clock's and the sync's
REPEATS = {"decode_b1": 3000, "chunk_fwd": 300, "chunk_fwd_bwd": 100}
H, HV, D = 16, 32, 128


def _timing_module():
    """This checkout's gdn/matrix/timing.py, loaded as a file: the child's `gdn` is the tree's."""
    spec = importlib.util.spec_from_file_location("_public_calls_timing", ROOT / "src/gdn/matrix/timing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _us_per_call(fn: Callable[[], object], repeats: int) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e6


def child() -> dict[str, float]:
    import torch

    import gdn

    timing = _timing_module()
    (q, k, v, g, beta), pool, indices = timing.pool_decode_inputs(1, H, HV, D, D)
    q1, k1, v1, g1, b1 = timing.chunk_inputs(1, 8192, H, HV, D)
    grad = torch.randn_like(v1)

    def decode():
        with torch.no_grad():
            return gdn.fused_recurrent_gated_delta_rule_update(
                q, k, v, g, beta, pool, indices, use_qk_l2norm_in_kernel=True
            )

    def chunk_fwd():
        with torch.no_grad():
            return gdn.chunk_gated_delta_rule(q1, k1, v1, g1, b1, use_qk_l2norm_in_kernel=True)

    def chunk_fwd_bwd():
        o, _ = gdn.chunk_gated_delta_rule(q1, k1, v1, g1, b1, use_qk_l2norm_in_kernel=True)
        o.backward(grad)

    fns = {"decode_b1": decode, "chunk_fwd": chunk_fwd, "chunk_fwd_bwd": chunk_fwd_bwd}
    for fn in fns.values():  # first calls: resolution, probes, compiles
        _us_per_call(fn, 20)
    return {name: _us_per_call(fn, REPEATS[name]) for name, fn in fns.items()}


def _run_child(tree: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{ROOT}", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.public_calls", "--child"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the child for {tree} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", metavar="NAME=DIR", help="a tree to time (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child()))
        return
    trees = dict(item.split("=", 1) for item in args.tree or ["this=."])
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for index in range(args.rounds):
        for name, path in trees.items():
            rounds[name].append(_run_child((ROOT / path).resolve()))
            print(f"round {index}: {name} {rounds[name][-1]}", flush=True)
    timing = _timing_module()
    results = {
        name: {
            call: {"us": statistics.median([r[call] for r in runs]), "rounds": [r[call] for r in runs]}
            for call in CALLS
        }
        for name, runs in rounds.items()
    }
    payload = {"environment": timing.environment(), "trees": trees, "repeats": REPEATS, "results": results}
    path = timing.write_results("public-calls", payload)
    for name, result in results.items():
        print(name, {call: round(value["us"], 1) for call, value in result.items()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
