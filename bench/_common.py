"""Shared pieces of the benchmarks: timing (triton.testing.do_bench, median), peak memory, the
environment stamp (card, versions, date) and the results file."""

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

RESULTS_DIR = Path(__file__).parent / "results"


def versions(*dists: str) -> dict[str, str | None]:
    found = {}
    for name in ("torch", "triton", "transformers", *dists):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return found


def environment(*dists: str) -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "card": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "versions": versions(*dists),
    }


def median_ms(fn: Callable[[], object], grad_to_none: list[torch.Tensor] | None = None) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=50, rep=300, grad_to_none=grad_to_none, return_mode="median"))


def peak_gib(fn: Callable[[], object]) -> float:
    """Peak device memory the call allocates on top of what was live before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


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


def write_matrix_rows(path: Path, op: str, payload: dict) -> None:
    """bench.json of a matrix cell: one row per (impl, shape, pass) with its median time."""
    rows = [
        {
            "op": op,
            "impl": r["impl"],
            "shape": r["shape"],
            "pass": name,
            "ms": r[f"{name}_ms"],
            "peak_gib": r.get(f"{name}_peak_gib"),
        }
        for r in payload["rows"]
        for name in ("fwd", "fwd_bwd")
        if f"{name}_ms" in r
    ]
    path.write_text(json.dumps({"environment": payload["environment"], "rows": rows}, indent=2))


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(f"{r.get(c, '')}") for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(f"{r.get(c, '')}".ljust(w) for c, w in zip(columns, widths, strict=True)))
    sys.stdout.flush()
