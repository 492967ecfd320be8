"""State-pool decode: the triton backend's fused recurrent update vs flash-linear-attention's fused
recurrent, same shapes, same run (GPU).

One token per sequence, B sequences in a pool of 2B slots at random distinct indices, HV = 32 value
heads over H = 16 query/key heads, K = V = 128, bf16 q/k/v/beta, fp32 g and fp32 states, q/k l2norm
in the kernel. Decode is bound by the state traffic, so each row reports the effective state
bandwidth (B * HV * K * V * 4 bytes read + the same written) / median time, next to the copy ceiling
measured in the same run (a large device-to-device copy).

Rows: `gdn` is the public call as a serving engine makes it (`gdn.fused_recurrent_gated_delta_rule_update`:
validation, resolution and launch, back to back, so host time between launches counts) and its
`of_kernel` column is the kernel-only time over its time, and the same call captured in a CUDA graph and
replayed; `prepared step` is the same update through `gdn.PreparedPoolDecode` (validated and resolved once,
then called every token); every call is timed inside one no_grad, as a serving loop runs (before
2026-12-03 each public call entered no_grad itself, which its times then included); `gdn-triton` is
the kernel behind validation, with the launch heuristic and with each V-slice / warp setting of the sweep (the knobs of
gdn.backends.triton.decode.OVERRIDES); `fla` is its kernel alone on states gathered
beforehand (its API has no pool: it reads h0 and writes a separate final state, the same traffic);
`fla+gather/scatter` adds the gather from and scatter to the pool that serving with it needs. Rows
marked `back to back` time the same call repeated without pause (the host's time per call, as a decode
loop that does not wait for the device pays it; those marked `Triton's launch path` launch every kernel
through JITFunction.run instead of its known binary's launcher): do_bench clears the L2 cache before
each call, and the host launches the next kernel while that clearing runs, so its times hide up to
that long of host work per call. The
`bf16 state pool` rows are the kernel and the public call on a bf16 pool (fp32 arithmetic, the state
rounded into the pool): their bandwidth counts the bf16 bytes they move, their time is what serving with
such a pool gains; `value-first` rows take the pool in fla's state_v_first layout ([slots, HV, V, K]).

Usage: PYTHONPATH=src:. python -m bench.decode [--batches 1 64 256] [--no-sweep]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path

import torch

import gdn
from gdn.backends.triton import decode
from gdn.backends.triton import launch as launching
from gdn.calls import PREPARE
from gdn.matrix.timing import environment, median_ms, pool_decode_inputs, print_table, write_results
from gdn.resolve import compute_mode_override

H, HV, K, V = 16, 32, 128, 128
# launch knobs of a one-token step tried beside the heuristic, on the fp32 and on the bf16 pool: the
# slice width, warps, how many slices a program walks, the depth of its pipeline, and how many slot
# indices a step of the device-side scans reads (fewer dependent L2 reads before the state is written)
SWEEP = [
    {"BLOCK_N": 32},
    {"BLOCK_N": 128},
    {"BLOCK_N": 256},
    {"SLICES": 1, "STAGES": 1},
    {"SLICES": 2},
    {"STAGES": 2},
    {"STAGES": 4},
    {"BV": 16, "num_warps": 1},
    {"BV": 32, "num_warps": 1},
    {"BV": 32, "num_warps": 4},
    {"BV": 64, "num_warps": 4},
    # a bf16 row of 32 columns is 4 16-byte vectors, so 8 lanes share each K column and both reductions
    # over K take 3 shuffle steps per column (1 for an fp32 row of 64): wider bf16 slices put more
    # lanes along V and fewer along K
    {"BV": 64, "num_warps": 2},
    {"BV": 128, "num_warps": 4},
    {"BV": 128, "num_warps": 8},
    # longer walks: a group of slices spans the value heads of one q/k head (whose q and k it shares),
    # so a program's set-up (its row's checks, q and k) is paid once per more state
    {"SLICES": 4},
    {"SLICES": 4, "STAGES": 2},
    {"SLICES": 4, "STAGES": 4},
    {"BV": 128, "num_warps": 4, "SLICES": 2},
    {"BV": 32, "num_warps": 1, "SLICES": 8},
    {"BV": 32, "num_warps": 2, "SLICES": 8},
]
# the other pools timed beside the fp32 key-first one: (name, state dtype, value-first)
POOLS = [
    ("bf16", torch.bfloat16, False),
    ("fp32 value-first", torch.float32, True),
    ("bf16 value-first", torch.bfloat16, True),
]
TARGET_TBS = {256: 3.2}
OP = "fused_recurrent_gated_delta_rule_update"


def make_inputs(B: int):
    return pool_decode_inputs(B, H, HV, K, V)


def copy_ceiling_tbs() -> float:
    src = torch.empty(2**28, device="cuda", dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e12


def ours(inputs, pool, indices, state_v_first: bool = False):
    # validated once, outside timing
    call = PREPARE[OP](*inputs, pool, indices, use_qk_l2norm_in_kernel=True, state_v_first=state_v_first)
    return lambda: decode.fused_recurrent_gated_delta_rule_update(call)


def public(inputs, pool, indices, state_v_first: bool = False):
    """The public call (main runs every timing under no_grad, as a serving loop runs its steps)."""
    return lambda: gdn.fused_recurrent_gated_delta_rule_update(
        *inputs, pool, indices, use_qk_l2norm_in_kernel=True, state_v_first=state_v_first
    )


def value_first(pool: torch.Tensor) -> torch.Tensor:
    """The pool's values stored value-first, [slots, HV, V, K] (fla's state_v_first)."""
    return pool.transpose(-1, -2).contiguous()


def prepared(inputs, pool, indices):
    """A step prepared once (gdn.PreparedPoolDecode), called as a serving loop calls it every token."""
    step = gdn.PreparedPoolDecode(*inputs, pool, indices, use_qk_l2norm_in_kernel=True)
    return lambda: step(*inputs, indices)


def back_to_back_ms(fn, calls: int = 400, rounds: int = 7) -> float:
    """Time per call of `calls` calls made one after another, the device synchronised at the end of
    each round: the host's cost per call wherever it exceeds the kernel's. The median of `rounds`
    rounds: with one round of 2,000 calls, rows of one run on the H200's host contradicted each other
    (2026-12-04: the public call 34 µs a call through gdn's launcher, 17 through Triton's slower launch
    path; the same rows the median of seven rounds then put at 33 and 33); a slow stretch of the host
    lands in one round, not in the median."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def launch_floor_ms(inputs, pool, indices) -> tuple[float, float, float]:
    """Back to back, the decode kernel's known binary launched (a) as a prepared launch does once its
    key is built (stream lookup, launcher, tensors passed as their addresses), (b) by its launcher alone
    with every argument prepared, and (c) the same with the tensors themselves, whose pointers the
    launcher then reads and checks with the driver one by one: (b) is the least host time any Python
    caller of this kernel pays on this host."""
    launches, tensors = [], []
    run_launcher, prepared_call = launching._Binary.run_launcher, launching.PreparedLaunch.__call__

    def capture_launch(self, *args):
        launches.append((self, args))
        return run_launcher(self, *args)

    def capture_tensors(self, *given):
        tensors.append((*given, *self.tail))
        return prepared_call(self, *given)

    launching._Binary.run_launcher = capture_launch
    launching.PreparedLaunch.__call__ = capture_tensors
    try:
        step = prepared(inputs, pool, indices)
        for _ in range(3):  # the last finds its binary known to the step's launch
            step()
    finally:
        launching._Binary.run_launcher = run_launcher
        launching.PreparedLaunch.__call__ = prepared_call
    binary, (device, whole, addresses) = launches[-1]
    stream = binary.stream(device)

    def launcher_alone(values):
        return lambda: binary.launcher(
            *whole, stream, binary.function, binary.packed_metadata, None, None, None, *values
        )

    return (
        back_to_back_ms(lambda: binary.run_launcher(device, whole, addresses)),
        back_to_back_ms(launcher_alone(binary.values(addresses))),
        back_to_back_ms(launcher_alone(binary.values(tensors[-1]))),
    )


@contextlib.contextmanager
def tritons_launch_path():
    """Every launch through Triton's own per-launch path (JITFunction.run), as before the bundled
    kernels launched their known binaries directly: the host time that path costs, side by side."""
    os.environ[launching.DIRECT_ENV] = "0"
    launching.direct_launches.cache_clear()
    try:
        yield
    finally:
        del os.environ[launching.DIRECT_ENV]
        launching.direct_launches.cache_clear()


def graphed(step):
    """The public call captured in a CUDA graph (after a warm-up on a side stream); replaying it is what
    a serving engine that graphs its decode step pays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def fla_fns(inputs, pool, indices):
    """(kernel alone on pre-gathered states, kernel with the pool's gather and scatter) or None.
    Everything after v goes by keyword: fla's signature has gk and gv between g and beta."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    q, k, v, g, beta = inputs
    rows = indices.long()
    h0 = pool.index_select(0, rows)

    def fla(initial_state):
        return fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=initial_state, output_final_state=True, use_qk_l2norm_in_kernel=True
        )

    def kernel_only():
        return fla(h0)

    def with_pool():
        o, final = fla(pool.index_select(0, rows))
        pool.index_copy_(0, rows, final)
        return o

    return kernel_only, with_pool


def agreement(inputs, pool, indices) -> dict[str, dict[str, float]]:
    """One step from the same fresh pool, each implementation against gdn's eager op (fp32 math):
    ||impl - eager|| / ||eager|| for the outputs and the updated states. Run before any timing, which
    updates the pool in place."""
    want_pool = pool.clone()
    with compute_mode_override("eager"):
        want_o = gdn.fused_recurrent_gated_delta_rule_update(
            *inputs, want_pool, indices, use_qk_l2norm_in_kernel=True
        ).float()
    want_state = want_pool[indices.long()]

    def rel(a, b):
        return ((a.float() - b).norm() / b.norm()).item()

    mine = pool.clone()
    o = ours(inputs, mine, indices)()
    found = {"gdn-triton": {"o": rel(o, want_o), "state": rel(mine[indices.long()], want_state)}}
    fns = fla_fns(inputs, pool.clone(), indices)
    if fns is not None:
        ref_o, ref_final = fns[0]()
        found["fla"] = {"o": rel(ref_o, want_o), "state": rel(ref_final, want_state)}
    return found


def row(B: int, impl: str, config: str, ms: float, state_bytes: int, ceiling: float) -> dict:
    tbs = state_bytes / (ms * 1e-3) / 1e12
    return {
        "B": B,
        "impl": impl,
        "config": config,
        "ms": round(ms, 4),
        "state_TBps": round(tbs, 3),
        "of_copy": f"{tbs / ceiling:.0%}",
    }


def _knobs(cfg: decode.LaunchConfig) -> dict[str, int]:
    return {"BV": cfg.BV, "num_warps": cfg.num_warps, "SLICES": cfg.SLICES, "STAGES": cfg.STAGES}


def _label(knobs: dict[str, int]) -> str:
    return " ".join(f"{'w' if name == 'num_warps' else name}={value}" for name, value in knobs.items())


def bench_batch(B: int, sweep: bool, ceiling: float) -> tuple[list[dict], dict]:
    inputs, pool, indices = make_inputs(B)
    checks = {"agreement_vs_eager": agreement(inputs, pool, indices)}
    state_bytes = 2 * B * HV * K * V * 4
    decode.OVERRIDES.clear()
    default = decode.launch_config(B, H, HV, K, V, pool.device, one_token=True, state_bytes=pool.element_size())
    kernel_ms = median_ms(ours(inputs, pool, indices))
    public_ms = median_ms(public(inputs, pool, indices))
    graph_ms = median_ms(graphed(public(inputs, pool, indices)))
    public_b2b_ms = back_to_back_ms(public(inputs, pool, indices))
    prepared_ms = median_ms(prepared(inputs, pool, indices))
    prepared_b2b_ms = back_to_back_ms(prepared(inputs, pool, indices))
    kernel_b2b_ms = back_to_back_ms(ours(inputs, pool, indices))
    with tritons_launch_path():
        public_jit_ms = back_to_back_ms(public(inputs, pool, indices))
        kernel_jit_ms = back_to_back_ms(ours(inputs, pool, indices))
    binary_ms, launcher_ms, launcher_tensors_ms = launch_floor_ms(inputs, pool, indices)
    rows = [
        {**row(B, "gdn", "public call", public_ms, state_bytes, ceiling), "of_kernel": f"{kernel_ms / public_ms:.0%}"},
        {
            **row(B, "gdn", "public call, back to back", public_b2b_ms, state_bytes, ceiling),
            "of_kernel": f"{kernel_b2b_ms / public_b2b_ms:.0%}",
        },
        row(B, "gdn", "public call in a CUDA graph", graph_ms, state_bytes, ceiling),
        {
            **row(B, "gdn", "prepared step", prepared_ms, state_bytes, ceiling),
            "of_kernel": f"{kernel_ms / prepared_ms:.0%}",
        },
        {
            **row(B, "gdn", "prepared step, back to back", prepared_b2b_ms, state_bytes, ceiling),
            "of_kernel": f"{kernel_b2b_ms / prepared_b2b_ms:.0%}",
        },
        row(B, "gdn-triton", f"heuristic {_label(_knobs(default))}", kernel_ms, state_bytes, ceiling),
        row(B, "gdn-triton", "kernel, back to back", kernel_b2b_ms, state_bytes, ceiling),
        row(B, "gdn", "public call, back to back, Triton's launch path", public_jit_ms, state_bytes, ceiling),
        row(B, "gdn-triton", "kernel, back to back, Triton's launch path", kernel_jit_ms, state_bytes, ceiling),
        row(B, "gdn-triton", "its binary, back to back, arguments prepared", binary_ms, state_bytes, ceiling),
        row(B, "gdn-triton", "its binary's launcher alone, back to back", launcher_ms, state_bytes, ceiling),
        row(
            B,
            "gdn-triton",
            "its binary's launcher alone, back to back, given tensors",
            launcher_tensors_ms,
            state_bytes,
            ceiling,
        ),
    ]
    for knobs in SWEEP if sweep else []:
        decode.OVERRIDES.update(knobs)
        ms = median_ms(ours(inputs, pool, indices))
        decode.OVERRIDES.clear()
        rows.append(row(B, "gdn-triton", _label(knobs), ms, state_bytes, ceiling))
    for name, dtype, v_first in POOLS:
        other = pool.to(dtype)
        other = value_first(other) if v_first else other
        moved = state_bytes * other.element_size() // pool.element_size()
        cfg = decode.launch_config(B, H, HV, K, V, pool.device, True, other.element_size(), v_first)
        ms = median_ms(ours(inputs, other, indices, v_first))
        rows.append(row(B, "gdn-triton", f"{name} state pool, heuristic {_label(_knobs(cfg))}", ms, moved, ceiling))
        ms = median_ms(public(inputs, other, indices, v_first))
        rows.append(row(B, "gdn", f"{name} state pool, public call", ms, moved, ceiling))
        for knobs in SWEEP if sweep and dtype == torch.bfloat16 else []:
            decode.OVERRIDES.update(knobs)
            ms = median_ms(ours(inputs, other, indices, v_first))
            decode.OVERRIDES.clear()
            rows.append(row(B, "gdn-triton", f"{name} state pool, {_label(knobs)}", ms, moved, ceiling))
    fns = fla_fns(inputs, pool, indices)
    if fns is not None:
        rows.append(row(B, "fla", "kernel, states gathered beforehand", median_ms(fns[0]), state_bytes, ceiling))
        rows.append(row(B, "fla", "kernel, back to back", back_to_back_ms(fns[0]), state_bytes, ceiling))
        rows.append(row(B, "fla+gather/scatter", "pool semantics", median_ms(fns[1]), state_bytes, ceiling))
    return rows, checks


def host_profile(B: int = 1, calls: int = 3000, top: int = 25) -> list[dict]:
    """Where the host time of the public call goes: cProfile over `calls` calls, the functions with the
    most time of their own, in µs per public call (the profiler's own cost inflates each a little)."""
    import cProfile
    import pstats

    inputs, pool, indices = make_inputs(B)
    step = public(inputs, pool, indices)
    for _ in range(100):
        step()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler).stats
    rows = [
        {
            "function": f"{Path(where).name}:{line}({name})",
            "calls_per_call": round(count / calls, 2),
            "own_us": round(own / calls * 1e6, 2),
            "cumulative_us": round(cumulative / calls * 1e6, 2),
        }
        for (where, line, name), (_, count, own, cumulative, _) in stats.items()
    ]
    rows.sort(key=lambda r: r["own_us"], reverse=True)
    return rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--no-sweep", action="store_true", help="time only the launch heuristic")
    parser.add_argument("--host-profile", action="store_true", help="profile the public call's host time at B=1")
    args = parser.parse_args()

    ceiling = copy_ceiling_tbs()
    rows, checks = [], {}
    # the serving kernels are forward only: a serving loop runs its steps under no_grad (or inference
    # mode) once, not around each call, so every call here is timed inside one no_grad
    with torch.no_grad():
        for B in args.batches:
            batch_rows, checks[B] = bench_batch(B, not args.no_sweep, ceiling)
            rows += batch_rows
    env = environment("fla-core", "flash-linear-attention")
    print(f"copy ceiling {ceiling:.2f} TB/s; state bandwidth = (state read + written) / median time")
    print_table(rows, ["B", "impl", "config", "ms", "state_TBps", "of_copy", "of_kernel"])
    for B, check in checks.items():
        print(f"B={B}: rel err vs eager: {check['agreement_vs_eager']}")
    with torch.no_grad():
        profile = host_profile() if args.host_profile else None
    if profile:
        print("host time of the public call at B=1, per function (µs per call):")
        print_table(profile, ["function", "calls_per_call", "own_us", "cumulative_us"])
    payload = {
        "environment": env,
        "shape": {"H": H, "HV": HV, "K": K, "V": V, "tokens_per_sequence": 1, "pool_slots": "2 * B"},
        "dtypes": {"qkv_beta": "bfloat16", "g": "float32", "state": "float32"},
        "use_qk_l2norm_in_kernel": True,
        "copy_ceiling_TBps": round(ceiling, 3),
        "target_TBps": TARGET_TBS,
        "rows": rows,
        "checks": {str(B): c for B, c in checks.items()},
        "host_profile_B1": profile,
    }
    path = write_results("decode", payload)
    print(f"{env['card']}  triton {env['versions']['triton']}  written {path}")


if __name__ == "__main__":
    main()
