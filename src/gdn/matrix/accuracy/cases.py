"""The accuracy table's cases: per op, inputs of each dtype, gate regime and layout, drawn fresh from a
seeded generator, and the quantities each case compares.

Gate regimes:
- `mild`: g = logsigmoid(N(0, 1)), a decay of about a half per token;
- `qwen`: Qwen3.5's at initialisation, as transformers initialises the layer: g = -exp(A_log) *
  softplus(a + dt_bias) with A_log = log U(0, 16) per value head, dt_bias = 1 and a ~ N(0, 1): most
  heads forget within a few tokens, and dg is a difference of large terms.
beta = sigmoid(N(0, 1)); q, k, v ~ N(0, 1) with q/k l2norm in the kernel, as Qwen3.5 calls the op.

Layouts: `dense` (one row of T tokens) and `packed` (sequences of uneven length packed along T with
cu_seqlens: one of a single token, one of a whole chunk, the rest). Shapes: Qwen3.5's heads (H = 16,
HV = 32, K = V = 128) at T = 1024 on an accelerator; small ones on the CPU, where the Triton kernels run
under the interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

GATED_OPS = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule_update")
CONV_OPS = ("causal_conv1d_fn", "causal_conv1d_update")
OPS = (*GATED_OPS, *CONV_OPS)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
REGIMES = ("mild", "qwen")
LAYOUTS = ("dense", "packed")
# what each op's rows compare, in the order the table shows them
QUANTITIES = {
    "chunk_gated_delta_rule": ("o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"),
    "fused_recurrent_gated_delta_rule": ("o", "final_state"),
    "fused_recurrent_gated_delta_rule_update": ("o", "pool"),
    "causal_conv1d_fn": ("out", "final_states"),
    "causal_conv1d_update": ("out", "conv_state"),
}
# A_log = log U(0, A_MAX) and dt_bias = 1, as transformers initialises Qwen3.5's GDN layer
A_MAX, DT_BIAS = 16.0, 1.0


@dataclass(frozen=True)
class Size:
    """The shapes of one device's cases."""

    H: int
    HV: int
    K: int
    V: int
    T: int
    packed: tuple[int, ...]  # the packed layout's sequence lengths (summing to T)
    decode_batch: int
    pool_slots: int
    conv_dim: int
    conv_width: int

    def describe(self) -> dict[str, int]:
        return {"H": self.H, "HV": self.HV, "K": self.K, "V": self.V, "T": self.T}


ACCELERATOR = Size(
    H=16, HV=32, K=128, V=128, T=1024, packed=(1, 64, 300, 659), decode_batch=64, pool_slots=96, conv_dim=8192,
    conv_width=4,
)  # fmt: skip
HOST = Size(H=2, HV=4, K=32, V=32, T=80, packed=(1, 64, 15), decode_batch=6, pool_slots=9, conv_dim=16, conv_width=4)


def size_for(device: torch.device) -> Size:
    return HOST if device.type == "cpu" else ACCELERATOR


def _cu_seqlens(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=device)


def gate(regime: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Log-space decay g of `shape` (last dim the value heads), fp32."""
    if regime == "mild":
        return F.logsigmoid(torch.randn(shape, generator=gen))
    heads = shape[-1]
    A_log = torch.log(torch.rand(heads, generator=gen) * A_MAX).clamp_min(math.log(1e-6))
    a = torch.randn(shape, generator=gen)
    return -torch.exp(A_log) * F.softplus(a + DT_BIAS)


@dataclass
class GatedCase:
    """Inputs of one gated-delta case: leaves in the kernel's dtypes (q, k, v, beta in `dtype`; g and
    the states in fp32), and the loss weights (in the dtypes of what they weigh)."""

    layout: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    initial_state: torch.Tensor
    cu_seqlens: torch.Tensor | None
    o_weight: torch.Tensor
    state_weight: torch.Tensor


def gated_case(size: Size, layout: str, regime: str, dtype: torch.dtype, device: torch.device, seed: int) -> GatedCase:
    gen = torch.Generator().manual_seed(seed)
    B, T = 1, size.T
    lengths = size.packed if layout == "packed" else (T,)
    N = len(lengths)

    def draw(*shape: int, kind: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(kind).to(device)

    return GatedCase(
        layout=layout,
        q=draw(B, T, size.H, size.K),
        k=draw(B, T, size.H, size.K),
        v=draw(B, T, size.HV, size.V),
        g=gate(regime, (B, T, size.HV), gen).to(device),
        beta=torch.sigmoid(torch.randn(B, T, size.HV, generator=gen)).to(dtype).to(device),
        initial_state=draw(N, size.HV, size.K, size.V, kind=torch.float32),
        cu_seqlens=_cu_seqlens(lengths, device) if layout == "packed" else None,
        o_weight=draw(B, T, size.HV, size.V),
        state_weight=draw(N, size.HV, size.K, size.V, kind=torch.float32),
    )


@dataclass
class DecodeCase:
    """One token for each of `decode_batch` sequences against a pool; some rows padded (index -1)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    pool: torch.Tensor
    indices: torch.Tensor


def decode_case(size: Size, regime: str, dtype: torch.dtype, device: torch.device, seed: int) -> DecodeCase:
    gen = torch.Generator().manual_seed(seed)
    B = size.decode_batch
    indices = torch.randperm(size.pool_slots, generator=gen)[:B]
    indices[::4] = -1  # every fourth row is padding
    return DecodeCase(
        q=torch.randn(B, 1, size.H, size.K, generator=gen).to(dtype).to(device),
        k=torch.randn(B, 1, size.H, size.K, generator=gen).to(dtype).to(device),
        v=torch.randn(B, 1, size.HV, size.V, generator=gen).to(dtype).to(device),
        g=gate(regime, (B, 1, size.HV), gen).to(device),
        beta=torch.sigmoid(torch.randn(B, 1, size.HV, generator=gen)).to(dtype).to(device),
        pool=torch.randn(size.pool_slots, size.HV, size.K, size.V, generator=gen).to(device),
        indices=indices.to(torch.int32).to(device),
    )


@dataclass
class ConvCase:
    """A depthwise causal conv: packed sequences x [D, T] (each with its history in the pool), or one
    new token per pooled sequence x [B, D] for the update."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    pool: torch.Tensor
    indices: torch.Tensor
    query_start_loc: torch.Tensor | None
    has_initial_state: torch.Tensor | None


def conv_case(size: Size, op: str, dtype: torch.dtype, device: torch.device, seed: int) -> ConvCase:
    gen = torch.Generator().manual_seed(seed)
    D, W = size.conv_dim, size.conv_width
    update = op == "causal_conv1d_update"
    rows = size.decode_batch if update else len(size.packed)
    indices = torch.randperm(size.pool_slots, generator=gen)[:rows].to(torch.int32)
    return ConvCase(
        x=torch.randn((rows, D) if update else (D, size.T), generator=gen).to(dtype).to(device),
        weight=(torch.randn(D, W, generator=gen) / math.sqrt(W)).to(dtype).to(device),
        bias=torch.randn(D, generator=gen).to(dtype).to(device),
        pool=torch.randn(size.pool_slots, D, W - 1, generator=gen).to(dtype).to(device),
        indices=indices.to(device),
        query_start_loc=None if update else _cu_seqlens(size.packed, device).to(torch.int32),
        # the first sequence starts fresh, the others continue from their pooled history
        has_initial_state=None if update else (torch.arange(rows) > 0).to(device),
    )


def case_key(op: str, dtype: str, regime: str | None, layout: str | None) -> dict[str, Any]:
    return {"op": op, "dtype": dtype, "regime": regime, "layout": layout}
