"""STAND-IN behaviour of torch_npu.npu_chunk_gated_delta_rule (tests/standins/site/torch_npu), NOT the
real op: every check comes from the op's contract as gdn.backends.torch_npu_chunk.CONTRACT records it
(required arguments, layouts, dtypes, head limits); the arithmetic is gdn's eager recurrence in fp32,
with the outputs rounded to the contract's bf16, as the op returns them."""

from __future__ import annotations

import torch

from gdn.backends.eager import EAGER
from gdn.backends.torch_npu_chunk import CONTRACT
from gdn.calls import PREPARE


class ContractError(RuntimeError):
    """What the real op's TORCH_CHECKs and aclnn parameter checks raise."""


def _check(name: str, tensor, sizes: dict[str, int]) -> None:
    if tensor is None:
        raise ContractError(f"{name} cannot be empty")
    want = CONTRACT.dtypes[name]
    if tensor.dtype != want:
        raise ContractError(f"{name}: expected dtype {want}, got {tensor.dtype}")
    symbols = CONTRACT.layouts[name].split()
    if tensor.dim() != len(symbols):
        raise ContractError(f"{name}: expected {len(symbols)} dims ({CONTRACT.layouts[name]}), got {tensor.dim()}")
    for symbol, size in zip(symbols, tensor.shape, strict=True):
        if sizes.setdefault(symbol, size) != size:
            raise ContractError(f"{name}: dim {symbol} is {size}, elsewhere {sizes[symbol]}")


def run_fused_chunk(query, key, value, beta, initial_state, actual_seq_lengths, scale, g):
    if scale is None:
        raise ContractError("scale cannot be empty")
    sizes: dict[str, int] = {}
    arguments = {"query": query, "key": key, "value": value, "beta": beta, "g": g}
    arguments |= {"initial_state": initial_state, "actual_seq_lengths": actual_seq_lengths}
    for name, tensor in arguments.items():
        _check(name, tensor, sizes)
    if (sizes["K"], sizes["V"]) != CONTRACT.head_dims or max(sizes["H"], sizes["HV"]) > CONTRACT.max_heads:
        raise ContractError(f"unsupported head dims or counts {sizes}")
    if sizes["HV"] % sizes["H"]:
        raise ContractError(f"HV = {sizes['HV']} is not a multiple of H = {sizes['H']}")
    lengths = actual_seq_lengths.long()
    if int(lengths.sum()) != sizes["T"]:
        raise ContractError(f"actual_seq_lengths sum to {int(lengths.sum())}, T is {sizes['T']}")
    cu_seqlens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    call = PREPARE["chunk_gated_delta_rule"](
        query.float()[None],
        key.float()[None],
        value.float()[None],
        g[None],
        beta.float()[None],
        scale=scale,
        initial_state=initial_state.float().transpose(-1, -2),
        output_final_state=True,
        cu_seqlens=cu_seqlens,
    )
    out, final = EAGER.ops["chunk_gated_delta_rule"](call)
    return out[0].to(CONTRACT.dtypes["out"]), final.transpose(-1, -2).to(CONTRACT.dtypes["final_state"]).contiguous()
