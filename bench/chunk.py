"""chunk_gated_delta_rule: gdn's Triton kernels vs flash-linear-attention vs gdn eager, same run (GPU).

Times forward and forward+backward (median of triton.testing.do_bench) and the peak memory each
allocates, bf16, q/k l2norm in the kernel, at the issue's shapes. FLA's Hopper guard (its gated
backward refuses Triton >= 3.4, < 3.7.1) is bypassed for timing only: its numbers there are not a
statement that its backward is correct on that stack. Also checks each implementation against eager.

Usage: PYTHONPATH=src:. python -m bench.chunk [--quick] [--matrix-out FILE]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import gdn
from bench._common import environment, median_ms, peak_gib, print_table, write_matrix_rows, write_results

SHAPES = [(1, 8192, 16, 32, 128), (4, 4096, 16, 32, 128), (1, 32768, 16, 32, 128)]


def make_inputs(B, T, H, HV, D, dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen, dtype=dtype)

    q, k, v = randn(B, T, H, D), randn(B, T, H, D), randn(B, T, HV, D)
    g = -torch.rand(B, T, HV, device="cuda", generator=gen) * 0.2  # fp32 log decay, as Qwen3.5 computes it
    beta = torch.rand(B, T, HV, device="cuda", generator=gen, dtype=dtype)
    return [x.requires_grad_() for x in (q, k, v, g, beta)]


def gdn_impl(mode: str):
    def run(q, k, v, g, beta):
        gdn.set_compute_mode(mode)
        return gdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)

    return run


def fla_impl():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as exc:
        print(f"fla not importable: {exc}; timing without it")
        return None

    def run(q, k, v, g, beta):
        return chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)

    return run


def measure(fn, inputs, do) -> dict:
    def fwd():
        with torch.no_grad():
            return fn(*inputs)

    def fwd_bwd():
        out, _ = fn(*inputs)
        out.backward(do)

    return {
        "fwd_ms": round(median_ms(fwd), 3),
        "fwd_bwd_ms": round(median_ms(fwd_bwd, grad_to_none=inputs), 3),
        "fwd_peak_gib": round(peak_gib(fwd), 3),
        "fwd_bwd_peak_gib": round(peak_gib(fwd_bwd), 3),
    }


def agreement(fn, ref, inputs, do) -> str:
    """max over o and the five gradients of ||impl - eager|| / ||eager||."""
    results = []
    for f in (fn, ref):
        for x in inputs:
            x.grad = None
        out, _ = f(*inputs)
        out.backward(do)
        results.append([out.detach().float(), *(x.grad.float() for x in inputs)])
    worst = max(((a - b).norm() / b.norm()).item() for a, b in zip(*results, strict=True))
    return f"{worst:.2e}"


def main() -> None:
    from gdn.backends.fla import bypass_hopper_guard

    quick = "--quick" in sys.argv
    shapes = SHAPES[:1] if quick else SHAPES
    impls = {"triton": gdn_impl("triton"), "fla": fla_impl(), "eager": gdn_impl("eager")}
    impls = {name: fn for name, fn in impls.items() if fn is not None}
    rows = []
    with bypass_hopper_guard():
        for B, T, H, HV, D in shapes:
            inputs = make_inputs(B, T, H, HV, D)
            do = torch.randn(B, T, HV, D, device="cuda", dtype=torch.bfloat16)
            shape = f"B={B} T={T} H={H} HV={HV} K=V={D}"
            for name, fn in impls.items():
                check = agreement(fn, impls["eager"], inputs, do) if name != "eager" else "-"
                rows.append({"shape": shape, "impl": name, **measure(fn, inputs, do), "rel_err_vs_eager": check})
            torch.cuda.empty_cache()
    for row in rows:
        fla = next((r for r in rows if r["shape"] == row["shape"] and r["impl"] == "fla"), None)
        if fla and row["impl"] == "triton":
            row["fwd_bwd_vs_fla"] = round(row["fwd_bwd_ms"] / fla["fwd_bwd_ms"], 3)
            row["fwd_vs_fla"] = round(row["fwd_ms"] / fla["fwd_ms"], 3)
    env = environment("fla-core")
    columns = ["shape", "impl", "fwd_ms", "fwd_bwd_ms", "fwd_peak_gib", "fwd_bwd_peak_gib", "rel_err_vs_eager"]
    print_table(rows, [*columns, "fwd_vs_fla", "fwd_bwd_vs_fla"])
    payload = {
        "environment": env,
        "dtype": "bfloat16",
        "use_qk_l2norm_in_kernel": True,
        "rows": rows,
        "note": "fla timed with its Hopper guard bypassed (timing only)",
    }
    if "--matrix-out" in sys.argv:
        write_matrix_rows(Path(sys.argv[sys.argv.index("--matrix-out") + 1]), "chunk_gated_delta_rule", payload)
        return
    print(f"written {write_results('chunk', payload)}")


if __name__ == "__main__":
    main()
