"""Shared pieces of the benchmarks (the cell's, gdn.matrix.bench, and the studies under the checkout's
bench/): the inputs (chunk op, state-pool decode), timing (triton.testing.do_bench, median), peak
memory, the environment stamp (card, versions, date) and the results file."""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

# the checkout's bench/results: src/gdn/matrix/timing.py -> the checkout root
RESULTS_DIR = Path(__file__).resolve().parents[3] / "bench" / "results"


def versions(*dists: str) -> dict[str, str | None]:
    found = {}
    for name in ("torch", "triton", "transformers", *dists):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return found


def environment(*dists: str, device: str = "cuda") -> dict:
    stamp = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "versions": versions(*dists),
    }
    if device == "cpu":  # a dry run of a script written for the accelerator
        return {**stamp, "device": device, "card": platform.processor() or platform.machine()}
    if device != "cuda":
        return {**stamp, "device": device, "card": getattr(torch, device).get_device_name(0)}
    props = torch.cuda.get_device_properties(0)
    return {
        **stamp,
        "device": device,
        "card": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
    }


def chunk_inputs(B: int, T: int, H: int, HV: int, D: int, device: str = "cuda", dtype=torch.bfloat16) -> list:
    """q, k [B, T, H, D], v [B, T, HV, D] and beta in dtype, g fp32, all requiring grad, seeded."""
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen, dtype=dtype)

    q, k, v = randn(B, T, H, D), randn(B, T, H, D), randn(B, T, HV, D)
    g = -torch.rand(B, T, HV, device=device, generator=gen) * 0.2  # fp32 log decay, as Qwen3.5 computes it
    beta = torch.rand(B, T, HV, device=device, generator=gen, dtype=dtype)
    return [x.requires_grad_() for x in (q, k, v, g, beta)]


def pool_decode_inputs(B: int, H: int, HV: int, K: int, V: int, device: str = "cuda"):
    """One token per sequence: (q, k, v, g, beta) with bf16 q/k/v/beta and fp32 g, an fp32 state pool
    of 2B slots and B distinct random slot indices (int32)."""
    gen = torch.Generator(device=device).manual_seed(B)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device, generator=gen, dtype=dtype)

    q, k, v = randn(B, 1, H, K), randn(B, 1, H, K), randn(B, 1, HV, V)
    g = torch.nn.functional.logsigmoid(randn(B, 1, HV, dtype=torch.float32))
    beta = randn(B, 1, HV).sigmoid()
    pool = randn(2 * B, HV, K, V, dtype=torch.float32) * 0.1
    indices = torch.randperm(2 * B, device=device, generator=gen)[:B].to(torch.int32)
    return (q, k, v, g, beta), pool, indices


def median_ms(
    fn: Callable[[], object], grad_to_none: list[torch.Tensor] | None = None, *, warmup: int = 50, rep: int = 300
) -> float:
    """Median of triton.testing.do_bench; warmup and rep are its budgets in ms."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median"))


def peak_gib(fn: Callable[[], object], device: str = "cuda") -> float:
    """Peak device memory the call allocates on top of what was live before it."""
    mod = getattr(torch, device)
    mod.synchronize()
    mod.empty_cache()
    before = mod.memory_allocated()
    mod.reset_peak_memory_stats()
    fn()
    mod.synchronize()
    return (mod.max_memory_allocated() - before) / 2**30


def write_results(name: str, payload: dict) -> Path:
    """bench/results/<name>-<date>.json, and a copy under $OUT when the device tool collects files."""
    stamp = payload["environment"]["date"][:10]
    text = json.dumps(payload, indent=2)
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}-{stamp}.json"
    path.write_text(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], path.name).write_text(text)
    return path


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max([len(c), *(len(f"{r.get(c, '')}") for r in rows)]) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(f"{r.get(c, '')}".ljust(w) for c, w in zip(columns, widths, strict=True)))
    sys.stdout.flush()
