"""The child-process side of the stand-in generation tests (run through standins.harness).

    python -m standins.scenario --output PATH

In ascendc mode, on the stand-in device: resolve every op the backend serves, run the chunk op three
times as model layers would (K = V = 128, so the composite forward serves where shipped), a training
step with a loss on the final state once, and the conv once, each compared with eager on the same
inputs, then collect the manifest. Writes {"resolve": {"resolutions", "errors", "plan", "log",
"parity", "final_state_step"}, "manifest": ...} to PATH (not stdout: a library imported on the way may
print there).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import gdn
from gdn.backends.ascendc import AscendcBackend, routes
from gdn.backends.base import describe_error
from gdn.matrix import probe
from gdn.resolve import resolve

DEVICE = "cpu"  # what the stand-in torch_npu offers in the NPU's place
CHUNK_GRADS = ("q", "k", "v", "g", "beta", "initial_state")
CONV_GRADS = ("x", "weight", "bias", "initial_states")


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _chunk_inputs(gen: torch.Generator, *, final: bool) -> dict[str, Any]:
    """Packed sequences (one of them empty), grouped value heads, K = V = 128, an initial state."""
    T, K, V = 150, 128, 128
    return dict(
        q=torch.randn(1, T, 2, K, generator=gen),
        k=torch.randn(1, T, 2, K, generator=gen),
        v=torch.randn(1, T, 4, V, generator=gen),
        g=-torch.rand(1, T, 4, generator=gen) * 0.5,
        beta=torch.rand(1, T, 4, generator=gen),
        initial_state=torch.randn(4, 4, K, V, generator=gen) * 0.1,
        output_final_state=final,
        cu_seqlens=torch.tensor([0, 17, 17, 90, 150]),
        use_qk_l2norm_in_kernel=True,
    )


def _conv_inputs(gen: torch.Generator) -> dict[str, Any]:
    return dict(
        x=torch.randn(2, 64, 40, generator=gen),
        weight=torch.randn(64, 4, generator=gen),
        bias=torch.randn(64, generator=gen),
        activation="silu",
        initial_states=torch.randn(2, 64, 3, generator=gen),
        return_final_states=True,
    )


def resolve_all() -> dict[str, Any]:
    messages = _Messages()
    logging.getLogger("gdn").addHandler(messages)
    logging.getLogger("gdn").setLevel(logging.INFO)
    gdn.register_backend(AscendcBackend(), replace=True)
    gdn.set_compute_mode("ascendc")
    errors = {}
    for op in routes.SERVED:
        try:
            resolve(op, DEVICE)
        except Exception as exc:  # strict mode: the error is the finding
            errors[op] = describe_error(exc)
    parity, final_state_step = {}, None
    gen = torch.Generator().manual_seed(0)
    if "chunk_gated_delta_rule" not in errors:
        for _ in range(3):  # layers of a model: decisions must not be logged again
            parity["chunk"] = _compare(gdn.chunk_gated_delta_rule, _chunk_inputs(gen, final=False), CHUNK_GRADS)
        # a training step with a loss on the final state: served where the route can give its gradient
        final_state_step = _compare(gdn.chunk_gated_delta_rule, _chunk_inputs(gen, final=True), CHUNK_GRADS)
    if "causal_conv1d_fn" not in errors:
        parity["conv"] = _compare(gdn.causal_conv1d_fn, _conv_inputs(gen), CONV_GRADS)
    gdn.set_compute_mode("ascendc")
    logging.getLogger("gdn").removeHandler(messages)
    return {
        "resolutions": [r for r in gdn.resolutions() if r["requested_mode"] == "ascendc"],
        "errors": errors,
        "plan": routes.plan().record(),
        "log": messages.lines,
        "parity": parity,
        "final_state_step": final_state_step,
    }


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _compare(op: Callable, inputs: dict[str, Any], grads: tuple[str, ...]) -> dict[str, float]:
    results = {}
    for mode in ("ascendc", "eager"):
        gdn.set_compute_mode(mode)
        args = {
            k: (v.clone().requires_grad_(k in grads) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()
        }
        outputs = op(**args)
        outputs = [t for t in (outputs if isinstance(outputs, tuple) else (outputs,)) if t is not None]
        named = {f"out{i}": t for i, t in enumerate(outputs)}
        named |= {name: args[name] for name in ("conv_states", "ssm_pool") if name in args}
        if grads:
            gen = torch.Generator().manual_seed(1)
            loss = sum((t.float() * torch.randn(t.shape, generator=gen)).sum() for t in outputs)
            computed = torch.autograd.grad(loss, [args[n] for n in grads])
            named |= {f"d{n}": g for n, g in zip(grads, computed, strict=True)}
        results[mode] = named
    return {name: _rel(results["ascendc"][name], ref) for name, ref in results["eager"].items()}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m standins.scenario")
    parser.add_argument("--output", type=Path, required=True, metavar="PATH", help="write the JSON result here")
    args = parser.parse_args()
    result = {"resolve": resolve_all(), "manifest": probe.collect_manifest()}
    args.output.write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
