"""Inputs for the custom-op and torch.compile tests (tests/ops/test_compile.py,
tests/backends/triton/test_triton_compile.py): one call per custom op in gdn.library, a training step and
a decode step as a model makes them."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

import gdn
from gdn import library
from gdn.resolve import compute_mode_override, last_route
from reference import rel_err

B, T, H, HV, K, V, D, W = 2, 9, 1, 2, 8, 8, 16, 4
VS = 4  # the op cases' value dim: K != V, so a state's layout shows in its shape


def op_cases(device: str, gen: torch.Generator, *, grad: bool) -> dict[str, tuple]:
    """Arguments of every custom op, in schema order, fresh random values; the inputs of the
    differentiable ops require grad when `grad`."""

    def randn(*shape, scale=1.0, dtype=torch.float32, needs_grad=False):
        t = (torch.randn(*shape, generator=gen) * scale).to(device, dtype)
        return t.requires_grad_(grad and needs_grad)

    def gdn_args(plain_state: bool, v_first: bool) -> tuple:
        q, k = randn(B, T, H, K, needs_grad=True), randn(B, T, H, K, needs_grad=True)
        v = randn(B, T, HV, VS, needs_grad=True)
        g = (-torch.rand(B, T, HV, generator=gen) * 0.5).to(device).requires_grad_(grad)
        beta = torch.rand(B, T, HV, generator=gen).to(device).requires_grad_(grad)
        h0 = randn(B, HV, *((VS, K) if v_first else (K, VS)), scale=0.1, needs_grad=plain_state)
        return q, k, v, g, beta, None, h0, True, None, True, v_first

    q, k, v, g, beta = (t.detach() for t in gdn_args(False, False)[:5])
    pool = randn(2 * B, HV, VS, K, scale=0.1)  # value-first, as the pool op's case passes it
    slots = torch.randperm(2 * B, generator=gen)[:B].to(device, torch.int32)
    x_seq = randn(B, D, T, needs_grad=True)
    weight, bias = randn(D, W, needs_grad=True), randn(D, needs_grad=True)
    lengths = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    return {
        "chunk_gated_delta_rule": gdn_args(True, False),
        "fused_recurrent_gated_delta_rule": gdn_args(True, True),
        "fused_recurrent_gated_delta_rule_update": (q, k, v, g, beta, pool, slots, None, None, True, True),
        "causal_conv1d_fn": (x_seq, weight, bias, "silu", None, randn(B, D, W - 1, needs_grad=True), True),
        "causal_conv1d_fn_varlen": (
            randn(D, T),
            weight.detach(),
            bias.detach(),
            "silu",
            lengths,
            randn(3, D, W - 1),
            torch.tensor([2, 0], dtype=torch.int32, device=device),
            torch.tensor([True, False], device=device),
        ),
        "causal_conv1d_update": (randn(B, D), randn(B, D, W - 1), weight.detach(), bias.detach(), "silu", None),
        "l2norm": (randn(B, T, H, K, needs_grad=True), 1e-6),
        "fused_gdn_gating": (
            randn(HV, needs_grad=True),
            randn(B, T, HV, needs_grad=True),
            randn(B, T, HV, needs_grad=True),
            randn(HV, needs_grad=True),
        ),
    }


def custom_op(name: str):
    return getattr(torch.ops, library.NAMESPACE).__getattr__(name).default


class Block(torch.nn.Module):
    """The GDN layer's ops in a training step's order: conv with SiLU, q/k l2norm, the gate, the chunk op."""

    def __init__(self, gen: torch.Generator, device: str):
        super().__init__()

        def param(*shape, scale=0.3):
            return torch.nn.Parameter((torch.randn(*shape, generator=gen) * scale).to(device))

        self.conv_weight, self.conv_bias = param(2 * H * K + HV * V, W), param(2 * H * K + HV * V)
        self.A_log, self.dt_bias = param(HV), param(HV)
        self.gate = param(H * K, 2 * HV)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = gdn.causal_conv1d_fn(x.transpose(1, 2), self.conv_weight, self.conv_bias, activation="silu")
        mixed = mixed.transpose(1, 2)
        q, k, v = mixed.split([H * K, H * K, HV * V], dim=-1)
        q, k = (gdn.l2norm(t.reshape(B, T, H, K)) for t in (q, k))
        a, b = (q.reshape(B, T, H * K) @ self.gate).split(HV, dim=-1)
        g, beta = gdn.fused_gdn_gating(self.A_log, a, b, self.dt_bias)
        o, _ = gdn.chunk_gated_delta_rule(q, k, v.reshape(B, T, HV, V), g, beta)
        return F.silu(o).square().mean()


def training_step(block: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    loss = block(x)
    loss.backward()
    return [loss.detach(), *(p.grad for p in block.parameters())]


def decode_step(x, conv_state, weight, bias, q, k, v, g, beta, pool, slots) -> torch.Tensor:
    mixed = gdn.causal_conv1d_update(x, conv_state, weight, bias, "silu")
    o = gdn.fused_recurrent_gated_delta_rule_update(
        q, k, v, g, beta, pool, slots, use_qk_l2norm_in_kernel=True, state_v_first=True
    )
    return o * mixed.mean()


def decode_inputs(device: str, gen: torch.Generator) -> dict[str, Any]:
    cases = op_cases(device, gen, grad=False)
    x, conv_state, weight, bias = cases["causal_conv1d_update"][:4]
    q, k, v, g, beta, pool, slots = cases["fused_recurrent_gated_delta_rule_update"][:7]
    return dict(
        x=x, conv_state=conv_state, weight=weight, bias=bias, q=q, k=k, v=v, g=g, beta=beta, pool=pool, slots=slots
    )


def opcheck(name: str, device: str, gen: torch.Generator, mode: str) -> str:
    """torch.library.opcheck of one custom op in compute mode `mode`: schema, fake implementation,
    autograd registration and AOT dispatch agree with the op; returns the route that served it last."""
    with compute_mode_override(mode):
        torch.library.opcheck(custom_op(name), op_cases(device, gen, grad=True)[name])
        return last_route()


def _strided(t: Any) -> Any:
    """The same values laid out with the last two dimensions swapped in memory (a transposed view made
    whole and transposed back), as a model's q and k arrive after a split of a transposed conv output."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or min(t.shape[-2:]) < 2:
        return t
    return t.detach().transpose(-1, -2).contiguous().transpose(-1, -2)


def check_outputs_laid_out_as_their_fakes(name: str, device: str, gen: torch.Generator, mode: str) -> None:
    """The forward and backward custom ops of a differentiable op, on strided inputs: every output has
    the sizes and strides its fake implementation gives. A compiled graph (inductor) allocates and
    checks by the fake's layout, so a real output laid out otherwise fails there."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = tuple(_strided(a) for a in op_cases(device, gen, grad=False)[name])
    backward = getattr(torch.ops, library.NAMESPACE).__getattr__(f"{name}_backward").default
    with compute_mode_override(mode):
        outputs = custom_op(name)(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        grads = [torch.randn(o.shape, generator=gen).to(o) for o in outputs]
        real = {"forward": outputs, "backward": backward(*args, grads)}
        with FakeTensorMode(allow_non_fake_inputs=False) as fake_mode:
            fake_args = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake_grads = [fake_mode.from_tensor(g) for g in grads]
            fake_outputs = custom_op(name)(*fake_args)
            fake = {
                "forward": fake_outputs if isinstance(fake_outputs, tuple) else (fake_outputs,),
                "backward": backward(*fake_args, fake_grads),
            }
    for stage in ("forward", "backward"):
        got = [(tuple(t.shape), t.stride()) for t in real[stage]]
        said = [(tuple(t.shape), t.stride()) for t in fake[stage]]
        assert got == said, f"{name} {stage}: (sizes, strides) {got}, its fake says {said}"


def _explain(fn, *args, **kwargs):
    torch._dynamo.reset()
    return torch._dynamo.explain(fn)(*args, **kwargs)


def check_training_step(
    block: torch.nn.Module, x: torch.Tensor, backend: str, mode: str, tol: float, tol_of: dict[str, float] | None = None
) -> None:
    """The block compiled whole (fullgraph) has no graph break, and its loss and every parameter's
    gradient (through the ops' registered autograd) equal the uncompiled step's; `tol_of` overrides the
    tolerance of named parameters."""
    with compute_mode_override(mode):
        assert _explain(block, x).graph_break_count == 0
        expected = training_step(copy.deepcopy(block), x)
        torch._dynamo.reset()
        got = training_step(torch.compile(block, backend=backend, fullgraph=True), x)
    for name, a, b in zip(["loss", *(n for n, _ in block.named_parameters())], got, expected, strict=True):
        limit = (tol_of or {}).get(name, tol)
        assert rel_err(a, b) <= limit, f"{name}: rel err {rel_err(a, b):.3g} > {limit}"


def check_decode_step(inputs: dict[str, torch.Tensor], mode: str, tol: float) -> None:
    """The decode step compiled whole has no graph break, and its output and the pools it writes equal
    the uncompiled step's."""
    before = {n: t.clone() for n, t in inputs.items()}
    eager = {n: t.clone() for n, t in inputs.items()}
    with compute_mode_override(mode):
        assert _explain(decode_step, **{n: t.clone() for n, t in inputs.items()}).graph_break_count == 0
        expected = decode_step(**eager)
        torch._dynamo.reset()
        got = torch.compile(decode_step, backend="eager", fullgraph=True)(**inputs)
    assert rel_err(got, expected) <= tol
    for pool in ("conv_state", "pool"):
        assert not torch.equal(inputs[pool], before[pool]), f"{pool} was not written"
        assert rel_err(inputs[pool], eager[pool]) <= tol, pool
