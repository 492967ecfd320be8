"""The floor of pool decode's memory pattern: a walk over the same slots, value heads and V slices as
the decode step's, that loads each state slice, scales it and stores it (no reductions, no q / k / v),
beside the decode step itself, on an fp32 and a bf16 pool. What a slice width and walk cost in memory
alone, so that the step's time splits into memory and its own arithmetic.

B = 256, H = 16, HV = 32, K = V = 128, one token per sequence (bf16 q/k/v), state read + written.

Usage: PYTHONPATH=src:. python -m bench.decode_floor
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bench._common import environment, median_ms, pool_decode_inputs, print_table, write_results
from gdn.backends.triton import decode
from gdn.calls import PREPARE

B, H, HV, K, V = 256, 16, 32, 128, 128
# (BV, warps, slices a program walks, pipeline stages): the step's defaults and widths around them
WALKS = [(64, 2, 4, 3), (64, 4, 4, 3), (64, 2, 2, 3), (64, 4, 2, 3), (64, 4, 1, 1), (64, 2, 8, 3)]
WALKS += [(128, 4, 2, 3), (128, 8, 2, 3), (128, 4, 1, 1), (32, 1, 8, 3)]


@triton.jit
def _scale_walk(
    pool_ptr,
    slots_ptr,
    g_ptr,
    stride_n,
    stride_h,
    stride_k,
    stride_v,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    SLICES: tl.constexpr,
    STAGES: tl.constexpr,
):
    NV: tl.constexpr = V // BV
    i_n = tl.program_id(0)
    first = tl.program_id(1) * SLICES
    slot = tl.load(slots_ptr + i_n).to(tl.int64)
    o_k = tl.arange(0, K)
    for j in tl.range(0, SLICES, num_stages=STAGES):
        i_s = first + j
        i_hv = i_s // NV
        o_v = (i_s % NV) * BV + tl.arange(0, BV)
        base = slot * stride_n + i_hv.to(tl.int64) * stride_h
        p_h = pool_ptr + base + o_k[:, None] * stride_k + o_v[None, :] * stride_v
        decay = tl.exp(tl.load(g_ptr + i_n * HV + i_hv))
        tl.store(p_h, (tl.load(p_h).to(tl.float32) * decay).to(pool_ptr.dtype.element_ty))


def _row(pool: torch.Tensor, kind: str, ms: float, **knobs) -> dict:
    moved = 2 * B * HV * K * V * pool.element_size()
    return {
        "state": str(pool.dtype).removeprefix("torch."),
        "kind": kind,
        "walk": " ".join(f"{name}={value}" for name, value in knobs.items()),
        "ms": round(ms, 4),
        "state_TBps": round(moved / ms / 1e9, 3),
    }


def time_pool(pool: torch.Tensor, inputs: tuple, indices: torch.Tensor) -> list[dict]:
    decay_logs = inputs[3].reshape(B, HV)
    rows = []
    for BV, warps, slices, stages in WALKS:
        grid = (B, HV * (V // BV) // slices)

        def walk(BV=BV, warps=warps, slices=slices, stages=stages, grid=grid):
            strides = pool.stride()
            _scale_walk[grid](pool, indices, decay_logs, *strides, HV, K, V, BV, slices, stages, num_warps=warps)

        rows.append(_row(pool, "load, scale, store", median_ms(walk), BV=BV, w=warps, SLICES=slices, STAGES=stages))
    call = PREPARE["fused_recurrent_gated_delta_rule_update"](*inputs, pool, indices, use_qk_l2norm_in_kernel=True)
    cfg = decode.launch_config(B, H, HV, K, V, pool.device, one_token=True, state_bytes=pool.element_size())
    with torch.no_grad():
        ms = median_ms(lambda: decode.fused_recurrent_gated_delta_rule_update(call))
    rows.append(_row(pool, "decode step", ms, BV=cfg.BV, w=cfg.num_warps, SLICES=cfg.SLICES, STAGES=cfg.STAGES))
    return rows


def main() -> None:
    inputs, pool, indices = pool_decode_inputs(B, H, HV, K, V)
    rows = time_pool(pool, inputs, indices) + time_pool(pool.to(torch.bfloat16), inputs, indices)
    print_table(rows, ["state", "kind", "walk", "ms", "state_TBps"])
    shape = {"B": B, "H": H, "HV": HV, "K=V": K}
    path = write_results("decode-floor", {"environment": environment(), "shape": shape, "rows": rows})
    print(f"written {path}")


if __name__ == "__main__":
    main()
