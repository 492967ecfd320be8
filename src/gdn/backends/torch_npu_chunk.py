"""The `torch_npu` backend: torch_npu's own fused CANN op for the chunk op,
`torch_npu.npu_chunk_gated_delta_rule` (aclnnChunkGatedDeltaRule), a peer under test and never a
requirement. It is what vllm-ascend's prefill runs on Ascend when a start-up smoke call of the op
passes (else the Triton-Ascend fla chain), so an NPU cell measures it beside fla_npu's kernels.

The op's contract is data (CONTRACT), read from its sources: packed TND tensors with per-sequence
lengths, bf16 q/k/v/beta and state, fp32 g, the state value-first ([N, HV, V, K]), K = V = 128, at most
64 heads, no l2norm inside, inference only. The adapter turns gdn's call into that layout (q/k
l2-normalised first where the call asks, as vllm-ascend does; beta cast to the inputs' dtype, as
vllm-ascend does; the final state back to [N, HV, K, V] in fp32) and refuses, per call and on record,
what the op cannot take: inputs that are not bf16, or an fp32 initial state (vllm-ascend casts its
fp32 state to bf16 before the call, rounding it; gdn does not round a caller's state silently). Calls
that need gradients run eager (the op has no backward). Route: "torch_npu:<torch_npu version>".

Like the ascendc backend, it serves cpu tensors only under the labelled stand-in torch_npu of
tests/standins (gdn.backends.ascendc.device).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gdn.backends.ascendc import device as npu_device
from gdn.backends.base import Backend, OpTable, import_version
from gdn.backends.findings import Section, distribution, guarded, imported, mark_stand_in
from gdn.backends.registry import Registration
from gdn.calls import GdnCall
from gdn.gates import floored

NAME = "torch_npu"
REGISTRATION = Registration(
    name="torch_npu",
    backend="TorchNpuBackend",
    order=50,
    versions={"torch_npu": ("torch_npu", "distribution", "version")},
)
OP = "chunk_gated_delta_rule"
FUNCTION = "npu_chunk_gated_delta_rule"
L2NORM_EPS = 1e-6  # gdn's l2norm: x / sqrt(sum(x^2) + eps), in fp32


@dataclass(frozen=True)
class FusedOpContract:
    """What the sources say about the fused op: its signature, each tensor's layout (dimension symbols
    that agree across tensors) and dtype, and the limits on head dims and head counts."""

    function: str
    signature: str
    sources: tuple[str, ...]
    layouts: Mapping[str, str]
    dtypes: Mapping[str, torch.dtype]
    head_dims: tuple[int, int]  # (K, V)
    max_heads: int
    notes: str


CONTRACT = FusedOpContract(
    function=FUNCTION,
    signature=(
        "torch_npu.npu_chunk_gated_delta_rule(query, key, value, *, beta=None, initial_state=None, "
        "actual_seq_lengths=None, scale=None, g=None) -> (out, final_state)"
    ),
    sources=(
        "Ascend/op-plugin@3b050948:op_plugin/ops/opapi/ChunkGatedDeltaRuleKernelNpuOpApi.cpp "
        "(beta, initial_state, actual_seq_lengths and scale required; out bf16; final_state a clone of initial_state)",
        "torch_npu's API reference, torch_npu.npu_chunk_gated_delta_rule (layouts, dtypes, limits; inference only)",
        "vllm-project/vllm-ascend@02ff645d:vllm_ascend/ops/gdn.py (_chunk_gated_delta_rule_fused: q/k l2-normalised "
        "by the caller, g passed raw in fp32, beta cast to v's dtype, the fp32 state cast to bf16, "
        "actual_seq_lengths = diff(cu_seqlens))",
    ),
    layouts={
        "query": "T H K",
        "key": "T H K",
        "value": "T HV V",
        "beta": "T HV",
        "g": "T HV",
        "initial_state": "N HV V K",
        "actual_seq_lengths": "N",
        "out": "T HV V",
        "final_state": "N HV V K",
    },
    dtypes={
        "query": torch.bfloat16,
        "key": torch.bfloat16,
        "value": torch.bfloat16,
        "beta": torch.bfloat16,
        "initial_state": torch.bfloat16,
        "g": torch.float32,
        "actual_seq_lengths": torch.int32,
        "out": torch.bfloat16,
        "final_state": torch.bfloat16,
    },
    head_dims=(128, 128),
    max_heads=64,
    notes="HV a multiple of H; no backward; no l2norm inside; g = None means no decay",
)


def refusal(call: GdnCall) -> str | None:
    """Why the fused op cannot take this (validated) call, or None."""
    where = f"torch_npu.{FUNCTION}"
    half = CONTRACT.dtypes["query"]
    found = {name: t.dtype for name, t in (("q", call.q), ("k", call.k), ("v", call.v))}
    if any(dtype != half for dtype in found.values()):
        listed = ", ".join(f"{name} {str(dtype).removeprefix('torch.')}" for name, dtype in found.items())
        return f"{where} takes bfloat16 q, k, v; got {listed}"
    state = call.initial_state
    if state is not None and state.dtype != CONTRACT.dtypes["initial_state"]:
        return (
            f"{where} takes a bfloat16 initial state (vllm-ascend rounds its fp32 state to bf16 first); "
            f"got {str(state.dtype).removeprefix('torch.')}"
        )
    shapes = call.shapes
    if CONTRACT.head_dims != (shapes.K, shapes.V):
        return f"{where} takes K = V = {CONTRACT.head_dims[0]} only; got K = {shapes.K}, V = {shapes.V}"
    if max(shapes.H, shapes.HV) > CONTRACT.max_heads:
        return f"{where} takes at most {CONTRACT.max_heads} heads; got H = {shapes.H}, HV = {shapes.HV}"
    return None


def _l2normalise(x: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt((x32 * x32).sum(-1, keepdim=True) + L2NORM_EPS)).to(x.dtype)


def _load() -> OpTable:
    torch_npu = importlib.import_module("torch_npu")
    fused = getattr(torch_npu, FUNCTION)  # an AttributeError names the torch_npu without the op

    def chunk_gated_delta_rule(call: GdnCall):
        shapes = call.shapes
        B, T, HV, V = shapes.B, shapes.T, shapes.HV, shapes.V
        q, k = call.q, call.k
        if call.use_qk_l2norm_in_kernel:
            q, k = _l2normalise(q), _l2normalise(k)
        if call.cu_seqlens is None:
            lengths = torch.full((B,), T, dtype=torch.int32, device=q.device)
        else:
            lengths = torch.diff(call.cu_seqlens).to(torch.int32)
        state = call.initial_state
        if state is None:
            state = q.new_zeros(shapes.N, HV, V, shapes.K, dtype=CONTRACT.dtypes["initial_state"])
        else:
            state = state.transpose(-1, -2).contiguous()  # the op's value-first layout
        out, final = fused(
            q.reshape(B * T, shapes.H, shapes.K).contiguous(),
            k.reshape(B * T, shapes.H, shapes.K).contiguous(),
            call.v.reshape(B * T, HV, V).contiguous(),
            beta=call.beta.to(call.v.dtype).reshape(B * T, HV).contiguous(),
            initial_state=state,
            actual_seq_lengths=lengths,
            scale=call.scale,
            # the op chunks the sequence and takes differences of cumulative gates: -inf is floored (gdn.gates)
            g=floored(call.g.float()).reshape(B * T, HV).contiguous(),
        )
        final_state = final.transpose(-1, -2).float() if call.output_final_state else None
        return out.reshape(B, T, HV, V), final_state

    return {OP: chunk_gated_delta_rule}


@dataclass(eq=False)
class TorchNpuBackend(Backend):
    name: str = NAME
    devices: tuple[str, ...] = ("npu", "cpu")  # cpu only under the stand-in torch_npu (gdn.backends.ascendc.device)
    # after gdn's own kernels and fla's: an inference-only peer under test
    auto_rank: Mapping[str, int] = field(default_factory=lambda: {"npu": 3})
    # bf16 inputs and outputs and a bf16 state between chunks: bf16 rounding, like the ascendc chain
    probe_tolerance: Mapping[str, float] = field(default_factory=lambda: {OP: 2e-2})
    probe_dtype: Any = torch.bfloat16
    probe_head_dims: tuple[int, int] | None = CONTRACT.head_dims
    forward_only: frozenset[str] = frozenset({OP})
    trusts_values: frozenset[str] = frozenset({OP})  # the op reads the sequence lengths on the device unchecked
    peer: bool = True

    def check(self, device_type: str) -> str | None:
        return npu_device.why_not(device_type, npu_device.locate())

    def loader(self) -> OpTable:
        return _load()

    def route(self, op: str) -> str:
        return f"{NAME}:{import_version('torch_npu')}"

    def refusal(self, op: str, call: GdnCall) -> str | None:
        return refusal(call)

    def why_op_unavailable(self, op: str) -> str | None:
        return f"torch_npu has a fused op for the chunked prefill only (no {op})"

    def describe(self) -> dict[str, Callable[[], Any]]:
        return {"torch_npu": torch_npu_section}


def _npu_device_names() -> list[str]:
    return [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())]


def torch_npu_section() -> Section:
    """torch_npu's distribution, whether it imports (its import fails without CANN: libhccl.so), and
    the NPUs it sees."""
    torch_npu, import_found = imported("torch_npu")
    section: Section = {"distribution": distribution("torch_npu"), "import": import_found}
    if torch_npu is not None:
        mark_stand_in(section, torch_npu)
        guarded(section, "devices", _npu_device_names)
        section["device_count"] = len(section["devices"] or [])
    return section
