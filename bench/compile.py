"""torch.compile of a GDN layer's training step and of a decode step on the GPU: graph breaks
(torch._dynamo.explain), compiled against uncompiled results, and the time of each.

Training step: conv (SiLU) -> q/k l2norm -> gating -> chunk op -> loss, forward and backward, at
(B, T) = (1, 4096), H = 16, HV = 32, K = V = 128, bf16 (gates fp32). Decode step: conv update -> pool
decode (fp32 state pool of 2B slots, and a bf16 pool stored value-first) at B = 64. Compiled with
backend "inductor" and fullgraph; the ops run inside as gdn's custom ops (gdn.library), whose backward
recomputes the forward.

Usage: PYTHONPATH=src:. python -m bench.compile
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

import gdn
from gdn.matrix.timing import environment, median_ms, pool_decode_inputs, print_table, write_results

B, T, H, HV, D, W = 1, 4096, 16, 32, 128, 4
DECODE_B = 64
CHANNELS = 2 * H * D + HV * D


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)

        def param(*shape, scale=0.05, dtype=torch.bfloat16):
            return torch.nn.Parameter((torch.randn(*shape, generator=gen) * scale).to("cuda", dtype))

        self.conv_weight, self.conv_bias = param(CHANNELS, W, scale=0.3), param(CHANNELS)
        self.A_log, self.dt_bias = param(HV, dtype=torch.float32), param(HV, dtype=torch.float32)
        self.gate = param(H * D, 2 * HV)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = gdn.causal_conv1d_fn(x.transpose(1, 2), self.conv_weight, self.conv_bias, activation="silu")
        q, k, v = mixed.transpose(1, 2).split([H * D, H * D, HV * D], dim=-1)
        q, k = (gdn.l2norm(t.reshape(B, T, H, D)) for t in (q, k))
        a, b = (q.reshape(B, T, H * D) @ self.gate).split(HV, dim=-1)
        g, beta = gdn.fused_gdn_gating(self.A_log, a, b, self.dt_bias)
        o, _ = gdn.chunk_gated_delta_rule(q, k, v.reshape(B, T, HV, D), g, beta)
        return F.silu(o.float()).square().mean()


def train(layer: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    for p in layer.parameters():
        p.grad = None
    loss = layer(x)
    loss.backward()
    return [loss.detach(), *(p.grad for p in layer.parameters())]


def decode_step(x, conv_state, weight, bias, q, k, v, g, beta, pool, slots):
    mixed = gdn.causal_conv1d_update(x, conv_state, weight, bias, "silu")
    o = gdn.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, slots, use_qk_l2norm_in_kernel=True)
    return o.float().mean() + mixed.float().mean()


def value_first_decode_step(x, conv_state, weight, bias, q, k, v, g, beta, pool, slots):
    """The same step on a pool stored value-first ([slots, HV, V, K])."""
    mixed = gdn.causal_conv1d_update(x, conv_state, weight, bias, "silu")
    o = gdn.fused_recurrent_gated_delta_rule_update(
        q, k, v, g, beta, pool, slots, use_qk_l2norm_in_kernel=True, state_v_first=True
    )
    return o.float().mean() + mixed.float().mean()


def decode_row(name: str, step, inputs: dict[str, torch.Tensor]) -> dict:
    torch._dynamo.reset()
    with torch.no_grad():
        breaks = torch._dynamo.explain(step)(**{n: t.clone() for n, t in inputs.items()}).graph_break_count
        eager_inputs = {n: t.clone() for n, t in inputs.items()}
        expected = step(**eager_inputs)
        compiled_step = torch.compile(step, fullgraph=True)
        got = compiled_step(**inputs)
        worst = max(rel(got, expected), rel(inputs["pool"], eager_inputs["pool"]))
        return {"step": name, "graph_breaks": breaks, "max_rel_err_vs_eager": f"{worst:.2e}",
                "eager_ms": round(median_ms(lambda: step(**inputs)), 4),
                "compiled_ms": round(median_ms(lambda: compiled_step(**inputs)), 4)}  # fmt: skip


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def main() -> None:
    rows, env = [], environment(device="cuda")
    layer = Layer()
    x = torch.randn(B, T, CHANNELS, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    breaks = torch._dynamo.explain(layer)(x).graph_break_count
    eager = train(copy.deepcopy(layer), x)
    compiled_layer = torch.compile(layer, fullgraph=True)
    got = train(compiled_layer, x)
    worst = max(rel(a, b) for a, b in zip(got, eager, strict=True))
    rows.append({"step": "training", "graph_breaks": breaks, "max_rel_err_vs_eager": f"{worst:.2e}",
                 "eager_ms": round(median_ms(lambda: train(layer, x)), 3),
                 "compiled_ms": round(median_ms(lambda: train(compiled_layer, x)), 3)})  # fmt: skip

    (q, k, v, g, beta), pool, slots = pool_decode_inputs(DECODE_B, H, HV, D, D)
    conv = dict(
        x=torch.randn(DECODE_B, CHANNELS, device="cuda", dtype=torch.bfloat16),
        conv_state=torch.randn(DECODE_B, CHANNELS, W - 1, device="cuda", dtype=torch.bfloat16),
        weight=layer.conv_weight.detach(),
        bias=layer.conv_bias.detach(),
    )
    value_first_pool = pool.to(torch.bfloat16).transpose(-1, -2).contiguous()
    for name, step, state in (
        ("decode", decode_step, pool),
        ("decode, bf16 value-first pool", value_first_decode_step, value_first_pool),
    ):
        inputs = dict(**conv, q=q, k=k, v=v, g=g, beta=beta, pool=state, slots=slots)
        rows.append(decode_row(name, step, inputs))
    print_table(rows, ["step", "graph_breaks", "max_rel_err_vs_eager", "eager_ms", "compiled_ms"])
    payload = {
        "environment": env,
        "training": {"B": B, "T": T, "H": H, "HV": HV, "K": D, "V": D, "dtype": "bfloat16"},
        "decode": {"B": DECODE_B, "H": H, "HV": HV, "K": D, "V": D, "state": "float32"},
        "resolutions": gdn.resolutions(),
        "rows": rows,
    }
    print(f"written {write_results('compile', payload)}")


if __name__ == "__main__":
    main()
