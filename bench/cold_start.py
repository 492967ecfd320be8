"""Cold start of chunk_gated_delta_rule: what the first forward+backward costs in a fresh process with
empty compile caches, gdn's broken into its phases, next to fla and FlashQLA (GPU).

Each implementation runs in a child process of its own, with its own empty TRITON_CACHE_DIR and
TILELANG_CACHE_DIR (nothing compiled before is reused, as on a fresh node or rank). `fla` is fla as
installed (its chunk op goes to FlashQLA where FlashQLA is), `fla-triton` fla with FLA_FLASH_QLA=0. gdn's phases, each
timed to a device synchronisation:

- `import`: import torch and gdn, and the first CUDA allocation (the context);
- `backend`: loading the triton backend (Triton, the kernel modules, the driver's target);
- `resolve`: gdn.resolve's decision for the op as the first call makes it, the numeric probe included
  (its cases take the call's class, so its first case compiles the binaries the call launches), and
  `resolve: compiling ahead`, the part of it spent compiling the probe's binaries in one batch (the
  cases' eager references run meanwhile: `resolve: case <name>: eager`), and `resolve: case <name>`,
  each probe case's run and comparison with its reference (a case that compiles at its own launches,
  what the batch should have compiled, shows here; its triton run alone is `...: triton`);
- `first fwd`, `first bwd`: the first call at (1, 8192, 16, 32, 128) bf16, l2norm in the kernel, and its
  backward (they compile the call's own binaries);
- `again`: the same forward+backward once more (all compiled: the warm time);
- `new T`: a forward+backward at half the length (no binary should be new: lengths are runtime);
- `new head dim`: one at half the head dim as well (K = V = 64).

The binaries each Triton kernel compiled (Triton's in-process caches) and the launchers built (Triton's
cache directory) are counted per phase, and whether this Triton compiles a call's binaries ahead, in
parallel (gdn.backends.triton.compile_ahead), is recorded. Each compile and each launcher build is
also on a timeline (seconds from the process's start, the worker thread, each compile's stages from
Triton's compilation listener), so that which binary bounds a phase, and whether its launcher waited
for it, can be read. A peer's
row has its first forward+backward (fla's autotuning and FlashQLA's TileLang JIT included) and the next.

With --profile, gdn's resolve and first forward and backward run under cProfile (slower: the times
are then for reading the split, not for reporting) and the result has the functions of the most
cumulative time per phase.

Usage: PYTHONPATH=src:. python -m bench.cold_start [--impls gdn fla fla-triton flashqla] [--timeout 600] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SHAPE = (1, 8192, 16, 32, 128)
OP = "chunk_gated_delta_rule"
IMPLS = ("gdn", "fla", "fla-triton", "flashqla")
# fla hands its chunk op to FlashQLA where FlashQLA is installed; fla-triton is fla with that turned off
CHILD_ENV = {"fla-triton": {"FLA_FLASH_QLA": "0"}}


def _timed(fn: Callable[[], object]) -> float:
    import torch

    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return round(time.perf_counter() - start, 2)


def _profiled(fn: Callable[[], object], top: int = 30) -> tuple[float, list[dict]]:
    """_timed under cProfile, with the functions of the most cumulative time (threads the profiler
    does not follow, such as a compile pool's workers, show as the time their caller waits)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    seconds = _timed(lambda: profiler.runcall(fn))
    stats = pstats.Stats(profiler).stats
    rows = [
        {
            "function": f"{Path(where).name}:{line}({name})",
            "calls": count,
            "own_s": round(own, 3),
            "cum_s": round(cum, 3),
        }
        for (where, line, name), (_, count, own, cum, _) in stats.items()
    ]
    rows.sort(key=lambda r: r["cum_s"], reverse=True)
    return seconds, rows[:top]


def _step(call: Callable, B: int, T: int, H: int, HV: int, D: int) -> tuple[Callable, Callable, list]:
    """(forward, backward, inputs) of one call on fresh inputs; backward needs forward's output first."""
    from gdn.matrix.timing import chunk_inputs

    leaves = [x.requires_grad_() for x in chunk_inputs(B, T, H, HV, D)]
    out: list = []

    def forward():
        out[:] = [call(*leaves)]

    def backward():
        out[0].float().sum().backward()

    return forward, backward, leaves


def _binaries() -> dict[str, int]:
    """Binaries compiled so far per gdn Triton kernel (Triton >= 3.3 keeps them in device_caches,
    3.2 in cache)."""
    from triton.runtime.jit import JITFunction

    from gdn.backends.triton import chunk, l2norm
    from gdn.backends.triton.common import output, qk_grads, state, wy, wy_bwd

    counts = {}
    for module in (wy, wy_bwd, state, output, qk_grads, l2norm, chunk):
        for name, kernel in vars(module).items():
            if isinstance(kernel, JITFunction) and name.endswith("_kernel"):
                caches = getattr(kernel, "device_caches", None)
                found = (
                    sum(len(entry[0]) for entry in caches.values())
                    if caches is not None
                    else sum(len(cache) for cache in kernel.cache.values())
                )
                counts[name] = found
    return counts


def _launchers() -> int:
    """Launchers built so far: one shared library per distinct launch signature in Triton's cache."""
    return sum(1 for _ in Path(os.environ["TRITON_CACHE_DIR"]).rglob("__triton_launcher*"))


def _record_timeline(start: float) -> list[dict]:
    """Every compile (Triton's compilation listener, Triton >= 3.4) and every launcher build of
    compile_ahead from now on, as rows of a timeline in seconds from `start`."""
    import threading

    from triton import knobs

    from gdn.backends.triton import compile_ahead

    rows: list[dict] = []

    def since() -> float:
        return round(time.perf_counter() - start, 3)

    def compiled(*, src, metadata, metadata_group, times, cache_hit) -> None:
        end = since()
        rows.append(
            {
                "what": "compile",
                "kernel": src.name,
                "thread": threading.current_thread().name,
                "start_s": round(end - times.total / 1e6, 3),
                "end_s": end,
                "stages_ms": {"ast": times.ir_initialization // 1000}
                | {stage: us // 1000 for stage, us in times.lowering_stages},
                "cache_hit": cache_hit,
            }
        )

    knobs.compilation.listener = compiled
    build = compile_ahead._build_launcher

    def timed_build(source, metadata) -> None:
        begun = since()
        build(source, metadata)
        rows.append(
            {
                "what": "launcher",
                "kernel": source.name,
                "thread": threading.current_thread().name,
                "start_s": begun,
                "end_s": since(),
                "before_its_binary": isinstance(metadata, compile_ahead._MetadataNotYet),
            }
        )

    compile_ahead._build_launcher = timed_build
    return rows


def child_gdn(profile: bool = False) -> dict:
    phases: dict[str, float] = {}
    start = time.perf_counter()
    import torch

    import gdn
    import gdn.resolve
    from gdn.calls import PREPARE

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    phases["import"] = round(time.perf_counter() - start, 2)
    compiled: dict[str, dict[str, int]] = {}
    launchers: dict[str, int] = {}

    def after(phase: str) -> None:
        compiled[phase] = {k: v for k, v in _binaries().items() if v}
        launchers[phase] = _launchers()

    profiles: dict[str, list[dict]] = {}

    def phase(name: str, fn: Callable[[], object]) -> None:
        if profile:
            phases[name], profiles[name] = _profiled(fn)
        else:
            phases[name] = _timed(fn)

    def call(q, k, v, g, beta):
        return gdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]

    forward, backward, leaves = _step(call, *SHAPE)
    # the decision the first call makes, with the first call's own validated arguments (the probe runs
    # in their class); loading the backend (Triton, the kernel modules, the driver) timed apart
    like = PREPARE[OP](*leaves, use_qk_l2norm_in_kernel=True)
    phase("backend", lambda: gdn.resolve.backends()["triton"].why_unavailable("cuda"))
    timeline = _record_timeline(start)
    marks = {"resolve begins": round(time.perf_counter() - start, 3)}
    from gdn.backends.triton import chunk as triton_chunk

    ahead: list[float] = []
    batch = triton_chunk.compile_ahead

    def timed_compile_ahead(dry_runs, meanwhile=None):
        begun = time.perf_counter()
        batch(dry_runs, meanwhile)
        ahead.append(time.perf_counter() - begun)

    triton_chunk.compile_ahead = timed_compile_ahead
    from gdn import numeric_probe

    cases: dict[str, float] = {}
    compare = numeric_probe._compare

    def timed_compare(report, op, ref, fn, case, device):
        begun = time.perf_counter()
        failure = compare(report, op, ref, fn, case, device)
        torch.cuda.synchronize()
        cases[case.name] = round(time.perf_counter() - begun, 2)
        return failure

    numeric_probe._compare = timed_compare
    collect = numeric_probe._collect

    def timed_collect(op, fn, case, device):
        begun = time.perf_counter()
        collected = collect(op, fn, case, device)
        torch.cuda.synchronize()
        side = "eager" if fn is eager_op else "triton"
        cases[f"{case.name}: {side}"] = round(time.perf_counter() - begun, 2)
        return collected

    from gdn.backends.eager import EAGER

    eager_op = EAGER.ops[OP]
    numeric_probe._collect = timed_collect
    phase("resolve", lambda: gdn.resolve.resolve(OP, "cuda", like))
    marks["resolve ends"] = round(time.perf_counter() - start, 3)
    phases["resolve: compiling ahead"] = round(sum(ahead), 2)
    phases.update({f"resolve: case {name}": seconds for name, seconds in cases.items()})
    after("resolve")
    phase("first fwd", forward)
    phase("first bwd", backward)
    after("first fwd+bwd")
    forward, backward, _ = _step(call, *SHAPE)
    phases["again"] = _timed(lambda: (forward(), backward()))
    B, T, H, HV, D = SHAPE
    forward, backward, _ = _step(call, B, T // 2, H, HV, D)
    phases["new T"] = _timed(lambda: (forward(), backward()))
    after("new T")
    forward, backward, _ = _step(call, B, T // 2, H, HV, D // 2)
    phases["new head dim"] = _timed(lambda: (forward(), backward()))
    after("new head dim")
    from gdn.backends.triton import compile_ahead

    return {
        "phases_s": phases,
        "binaries": compiled,
        "launchers": launchers,
        "compiles_ahead": compile_ahead.supported(),
        "route": gdn.resolve.last_route(),
        "timeline": {"marks_s": marks, "rows": sorted(timeline, key=lambda row: row["start_s"])},
        **({"profiles": profiles} if profile else {}),
    }


def child_peer(impl: str) -> dict:
    start = time.perf_counter()
    import torch

    if impl.startswith("fla"):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    else:
        from flash_qla import chunk_gated_delta_rule
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    phases = {"import": round(time.perf_counter() - start, 2)}

    def call(q, k, v, g, beta):
        return chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]

    forward, backward, _ = _step(call, *SHAPE)
    phases["first fwd+bwd"] = _timed(lambda: (forward(), backward()))
    forward, backward, _ = _step(call, *SHAPE)
    phases["again"] = _timed(lambda: (forward(), backward()))
    return {"phases_s": phases}


def run_child(impl: str, timeout: float, profile: bool = False) -> dict:
    """One implementation in a fresh interpreter with empty caches; its JSON, or why there is none."""
    with tempfile.TemporaryDirectory(prefix="gdn-cold-") as tmp:
        caches = {"TRITON_CACHE_DIR": f"{tmp}/triton", "TILELANG_CACHE_DIR": f"{tmp}/tilelang"}
        env = os.environ | caches | CHILD_ENV.get(impl, {})
        output = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "bench.cold_start", "--child", impl, "--output", str(output)]
        command += ["--profile"] if profile else []
        start = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"impl": impl, "error": f"not done after {timeout:.0f} s"}
        wall = round(time.perf_counter() - start, 2)
        if done.returncode != 0:
            return {"impl": impl, "error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
        return {"impl": impl, "process_s": wall, **json.loads(output.read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    parser.add_argument("--profile", action="store_true", help="cProfile gdn's resolve and first calls")
    parser.add_argument("--child", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child_gdn(args.profile) if args.child == "gdn" else child_peer(args.child)
        Path(args.output).write_text(json.dumps(result))
        return

    from gdn.matrix.timing import environment, print_table, write_results

    results = [run_child(impl, args.timeout, args.profile) for impl in args.impls]
    rows = [
        {"impl": r["impl"], "phase": phase, "s": s}
        for r in results
        for phase, s in (r.get("phases_s") or {"error": r.get("error")}).items()
    ]
    print_table(rows, ["impl", "phase", "s"])
    for r in results:
        for phase, counts in (r.get("binaries") or {}).items():
            built = (r.get("launchers") or {}).get(phase)
            print(f"{r['impl']} binaries after {phase}: {sum(counts.values())}, launchers {built}: {counts}")
        for phase, top in (r.get("profiles") or {}).items():
            print(f"{r['impl']} {phase}: the functions of the most cumulative time")
            print_table(top[:20], ["function", "calls", "own_s", "cum_s"])
        if r.get("timeline"):
            print(f"{r['impl']} compiles and launcher builds (s from the process's start): {r['timeline']['marks_s']}")
            print_table(
                [{k: v for k, v in row.items() if k != "stages_ms"} for row in r["timeline"]["rows"]],
                ["what", "kernel", "thread", "start_s", "end_s"],
            )
        if "compiles_ahead" in r:
            print(f"{r['impl']} compiles a call's binaries ahead, in parallel: {r['compiles_ahead']}")
    payload = {
        "environment": environment("fla-core", "flash-qla", "tilelang"),
        "shape": dict(zip(("B", "T", "H", "HV", "K=V"), SHAPE, strict=True)),
        "results": results,
    }
    print(f"written {write_results('cold-start', payload)}")


if __name__ == "__main__":
    main()
