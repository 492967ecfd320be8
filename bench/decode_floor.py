"""The floor of pool decode's memory pattern: a walk over the same slots, value heads and V slices as
the decode step's, that loads each state slice, scales it and stores it (no reductions, no q / k / v),
beside the decode step itself, on fp32 and bf16 pools stored key-first ([slots, HV, K, V]) and
value-first ([slots, HV, V, K], state_v_first). What a slice width and walk cost in memory alone, so
that the step's time splits into memory and its own arithmetic.

B = 256, H = 16, HV = 32, K = V = 128, one token per sequence (bf16 q/k/v), state read + written.

Usage: PYTHONPATH=src:. python -m bench.decode_floor
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn.backends.triton import decode
from gdn.calls import PREPARE
from gdn.matrix.timing import environment, median_ms, pool_decode_inputs, print_table, write_results

B, H, HV, K, V = 256, 16, 32, 128, 128
# (BV, warps, slices a program walks, pipeline stages): the step's defaults and widths around them
WALKS = [(64, 2, 4, 3), (64, 4, 4, 3), (64, 2, 2, 3), (64, 4, 2, 3), (64, 4, 1, 1), (64, 2, 8, 3)]
WALKS += [(128, 4, 2, 3), (128, 8, 2, 3), (128, 4, 1, 1), (32, 1, 8, 3), (32, 1, 4, 3), (32, 2, 8, 3)]


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


def _row(pool: torch.Tensor, v_first: bool, kind: str, ms: float, **knobs) -> dict:
    moved = 2 * B * HV * K * V * pool.element_size()
    return {
        "state": str(pool.dtype).removeprefix("torch."),
        "layout": "value-first" if v_first else "key-first",
        "kind": kind,
        "walk": " ".join(f"{name}={value}" for name, value in knobs.items()),
        "ms": round(ms, 4),
        "state_TBps": round(moved / ms / 1e9, 3),
    }


def time_pool(stored: torch.Tensor, v_first: bool, inputs: tuple, indices: torch.Tensor) -> list[dict]:
    """`stored` holds the pool in its memory layout ([slots, HV, V, K] where v_first); the walks and the
    step address it as [slots, HV, K, V] through its strides."""
    pool = stored.transpose(-1, -2) if v_first else stored
    decay_logs = inputs[3].reshape(B, HV)
    rows = []
    for BV, warps, slices, stages in WALKS:
        grid = (B, HV * (V // BV) // slices)

        def walk(BV=BV, warps=warps, slices=slices, stages=stages, grid=grid):
            strides = pool.stride()
            _scale_walk[grid](pool, indices, decay_logs, *strides, HV, K, V, BV, slices, stages, num_warps=warps)

        ms = median_ms(walk)
        rows.append(_row(pool, v_first, "load, scale, store", ms, BV=BV, w=warps, SLICES=slices, STAGES=stages))
    call = PREPARE["fused_recurrent_gated_delta_rule_update"](
        *inputs, stored, indices, use_qk_l2norm_in_kernel=True, state_v_first=v_first
    )
    cfg = decode.launch_config(B, H, HV, K, V, pool.device, True, pool.element_size(), v_first)
    with torch.no_grad():
        ms = median_ms(lambda: decode.fused_recurrent_gated_delta_rule_update(call))
    knobs = dict(BV=cfg.BV, w=cfg.num_warps, SLICES=cfg.SLICES, STAGES=cfg.STAGES)
    rows.append(_row(pool, v_first, "decode step", ms, **knobs))
    return rows


def main() -> None:
    inputs, pool, indices = pool_decode_inputs(B, H, HV, K, V)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        typed = pool.to(dtype)
        rows += time_pool(typed, False, inputs, indices)
        rows += time_pool(typed.transpose(-1, -2).contiguous(), True, inputs, indices)
    print_table(rows, ["state", "layout", "kind", "walk", "ms", "state_TBps"])
    shape = {"B": B, "H": H, "HV": HV, "K=V": K}
    path = write_results("decode-floor", {"environment": environment(), "shape": shape, "rows": rows})
    print(f"written {path}")


if __name__ == "__main__":
    main()
