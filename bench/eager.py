"""Eager GDN chunk op vs transformers' torch implementation, same shapes, same run (GPU).

Times forward and forward+backward (median of triton.testing.do_bench) and the peak memory each
allocates, at (B, T, H, HV, K=V) = (1, 8192, 16, 32, 128), bf16, q/k l2norm in the op.
Usage: PYTHONPATH=src:. python -m bench.eager [--profile]
"""

from __future__ import annotations

import sys

import torch

import gdn
from gdn.matrix.timing import chunk_inputs, environment, median_ms, peak_gib, print_table, write_results

SHAPES = [(1, 8192, 16, 32, 128)]


def transformers_reference():
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from gdn.integrations.transformers import torch_function

    # transformers routes to fla when it is importable; unwrap to time its own torch code.
    return torch_function(modeling_qwen3_5.torch_chunk_gated_delta_rule)


def grouped(q, k, v):
    """transformers <= 5.17 expects q/k already repeated to the value heads (its module does it)."""
    group = v.shape[2] // q.shape[2]
    return q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2), v


def measure(name, fn, inputs, do):
    def fwd():
        with torch.no_grad():
            return fn(*inputs)

    def fwd_bwd():
        out, _ = fn(*inputs)
        out.backward(do)

    return {
        "impl": name,
        "fwd_ms": round(median_ms(fwd), 3),
        "fwd_bwd_ms": round(median_ms(fwd_bwd, grad_to_none=inputs), 3),
        "fwd_peak_gib": round(peak_gib(fwd), 3),
        "fwd_bwd_peak_gib": round(peak_gib(fwd_bwd), 3),
    }


def profile(impls, inputs) -> None:
    """Where the forward time goes: the top kernels by device time, per implementation."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for name, fn in impls.items():
        with torch.no_grad():
            fn(*inputs)
            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    fn(*inputs)
                torch.cuda.synchronize()
        print(f"== {name} (3 forward calls)")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


def main() -> None:
    gdn.set_compute_mode("eager")
    reference = transformers_reference()
    impls = {
        "gdn-eager": lambda q, k, v, g, b: gdn.chunk_gated_delta_rule(q, k, v, g, b, use_qk_l2norm_in_kernel=True),
        "transformers-torch": lambda q, k, v, g, b: reference(*grouped(q, k, v), g, b, use_qk_l2norm_in_kernel=True),
    }
    if "--profile" in sys.argv:
        profile(impls, chunk_inputs(*SHAPES[0]))
        return
    rows = []
    for B, T, H, HV, D in SHAPES:
        inputs = chunk_inputs(B, T, H, HV, D)
        do = torch.randn(B, T, HV, D, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            ours, theirs = (f(*inputs)[0].float() for f in impls.values())
        agreement = ((ours - theirs).norm() / theirs.norm()).item()
        for name, fn in impls.items():
            row = {"shape": f"B={B} T={T} H={H} HV={HV} K=V={D}", **measure(name, fn, inputs, do)}
            row["rel_err_vs_transformers"] = f"{agreement:.2e}"
            rows.append(row)
    env = environment()
    print_table(rows, ["shape", "impl", "fwd_ms", "fwd_bwd_ms", "fwd_peak_gib", "fwd_bwd_peak_gib"])
    print(f"forward agreement ||ours - transformers|| / ||transformers|| = {agreement:.2e}")
    payload = {"environment": env, "dtype": "bfloat16", "use_qk_l2norm_in_kernel": True, "rows": rows}
    path = write_results("eager", payload)
    print(f"{env['card']}  torch {env['versions']['torch']}  written {path}")


if __name__ == "__main__":
    main()
