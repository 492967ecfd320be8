"""Every backend gives the contiguous call's answer when one tensor argument is a non-contiguous view
of the same values: sliced with a step, transposed in memory, or (for small broadcastable tensors)
expanded from a stride-0 view. Tensors an op updates in place (the state pools) are compared after
the call too.

Each call is validated like the public op (gdn.calls.PREPARE), then handed to one backend's
implementation. Without a CUDA device the triton kernels run under the Triton interpreter.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from gdn.calls import PREPARE
from implementations import implementation

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ("eager", "triton")


@dataclass(frozen=True)
class Case:
    op: str
    make: Callable[[torch.Generator], dict[str, object]]
    in_place: tuple[str, ...] = ()
    # arguments whose values may be replaced by a stride-0 broadcast (same value along the last dim)
    expandable: tuple[str, ...] = ()


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)


def _index(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _gdn(gen: torch.Generator, B: int, T: int) -> dict[str, object]:
    H, HV, K, V = 2, 4, 8, 6
    return dict(
        q=_randn(gen, B, T, H, K),
        k=_randn(gen, B, T, H, K, scale=K**-0.5),
        v=_randn(gen, B, T, HV, V),
        g=-torch.rand(B, T, HV, generator=gen).to(DEVICE) * 0.5,
        beta=torch.rand(B, T, HV, generator=gen).to(DEVICE),
    )


def _chunk_like(op: str) -> Case:
    def make(gen: torch.Generator) -> dict[str, object]:
        args = _gdn(gen, 1, 9)
        args.update(
            initial_state=_randn(gen, 3, 4, 8, 6, scale=0.1),
            cu_seqlens=_index([0, 2, 6, 9]),
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        return args

    return Case(op, make, expandable=("g", "beta"))


def _pool_decode(gen: torch.Generator) -> dict[str, object]:
    args = _gdn(gen, 1, 5)
    args.update(
        ssm_pool=_randn(gen, 5, 4, 8, 6, scale=0.1), ssm_indices=_index([3, -1, 0]), cu_seqlens=_index([0, 2, 3, 5])
    )
    return args


def _conv_dense(gen: torch.Generator) -> dict[str, object]:
    B, D, T, W = 2, 6, 7, 4
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [2, 2, 3, 3, 3, 3, 4]], dtype=torch.int32, device=DEVICE)
    return dict(
        x=_randn(gen, B, D, T),
        weight=_randn(gen, D, W),
        bias=_randn(gen, D),
        activation="silu",
        seq_idx=seq_idx,
        initial_states=_randn(gen, B, D, W - 1),
        return_final_states=True,
    )


def _conv_varlen(gen: torch.Generator) -> dict[str, object]:
    D, W = 6, 4
    return dict(
        x=_randn(gen, D, 9),
        weight=_randn(gen, D, W),
        bias=_randn(gen, D),
        query_start_loc=_index([0, 2, 7, 9]),
        conv_states=_randn(gen, 5, D, W - 1),
        cache_indices=_index([4, -1, 1]),
        has_initial_state=torch.tensor([True, False, True], device=DEVICE),
    )


def _conv_update(gen: torch.Generator) -> dict[str, object]:
    D, W = 6, 4
    return dict(
        x=_randn(gen, 3, D, 2),
        conv_state=_randn(gen, 5, D, W),
        weight=_randn(gen, D, W),
        bias=_randn(gen, D),
        activation="silu",
        conv_state_indices=_index([2, -1, 0]),
    )


def _gating(gen: torch.Generator) -> dict[str, object]:
    return dict(A_log=_randn(gen, 4), a=_randn(gen, 3, 4), b=_randn(gen, 3, 4), dt_bias=_randn(gen, 4))


CASES = {
    "chunk": _chunk_like("chunk_gated_delta_rule"),
    "recurrent": _chunk_like("fused_recurrent_gated_delta_rule"),
    "pool_decode": Case("fused_recurrent_gated_delta_rule_update", _pool_decode, ("ssm_pool",), ("g", "beta")),
    "conv_dense": Case("causal_conv1d_fn", _conv_dense, expandable=("weight", "bias", "seq_idx")),
    "conv_varlen": Case("causal_conv1d_fn", _conv_varlen, ("conv_states",), ("weight", "bias", "has_initial_state")),
    "conv_update": Case("causal_conv1d_update", _conv_update, ("conv_state",), ("weight", "bias")),
    "l2norm": Case("l2norm", lambda gen: dict(x=_randn(gen, 3, 5, 8))),
    "gating": Case("fused_gdn_gating", _gating, expandable=("A_log", "a", "b", "dt_bias")),
}


def _stepped(t: torch.Tensor) -> torch.Tensor:
    """The values of t in a view that skips every other element of the last dim."""
    buffer = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    view = buffer[..., ::2]
    view.copy_(t)
    return view


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """The values of t with the last two dims swapped in memory."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _variants(case: Case, name: str, t: torch.Tensor) -> list[str]:
    kinds = ["step"]
    if t.ndim >= 2:
        kinds.append("transposed")
    if name in case.expandable:
        kinds.append("expanded")
    return kinds


def _params() -> list:
    params = []
    gen = torch.Generator().manual_seed(0)
    for label, case in CASES.items():
        for name, value in case.make(gen).items():
            if isinstance(value, torch.Tensor):
                kinds = _variants(case, name, value)
                params += [pytest.param(label, name, kind, id=f"{label}-{name}-{kind}") for kind in kinds]
    return params


def _call(impl: Callable, case: Case, args: dict[str, object]) -> list[torch.Tensor]:
    """The op's outputs followed by its in-place tensors after the call."""
    call = PREPARE[case.op](**args)
    with torch.no_grad():
        out = impl(call)
    outs = list(out) if isinstance(out, tuple) else [out]
    return [o for o in outs if o is not None] + [args[name] for name in case.in_place]


@pytest.mark.single_op
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("label", "name", "kind"), _params())
def test_non_contiguous_argument_gives_the_contiguous_answer(backend, label, name, kind, gen):
    case = CASES[label]
    impl = implementation(backend, case.op, DEVICE)
    args = case.make(gen)
    value = args[name]
    if kind == "expanded":
        value = value[..., :1].expand_as(value)
    strided = {"step": _stepped, "transposed": _transposed, "expanded": lambda t: t}[kind](value)
    assert not strided.is_contiguous()
    dense = dict(args, **{name: value.contiguous()})
    apart = dict(args, **{name: strided})
    for key in case.in_place:  # each call updates its own copy of the pools
        dense[key] = dense[key].clone()
        if key != name:
            apart[key] = apart[key].clone()

    expected, got = _call(impl, case, dense), _call(impl, case, apart)
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), f"output {i}: max diff {(a - b).abs().max().item()}"
