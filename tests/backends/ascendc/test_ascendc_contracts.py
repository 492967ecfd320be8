"""Every call the ascendc adapters make to an fla_npu op, checked against that op's contract on the
route that serves it (gdn.backends.ascendc.contracts, written from fla_npu's source at the commits it
cites). The raw ops are recording stand-ins: each records its calls and the contract's verdict on
them, then computes through the conforming stand-in kernel, so a test sees every violation of a
training step at once and every op the adapters rely on is shown to be called."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

from gdn.backends.ascendc import contracts
from gdn.backends.ascendc.chunk import BWD_DHU, ChunkKernels, make_chunk_gated_delta_rule, refusal_of
from gdn.backends.ascendc.conv import ConvKernels, make_causal_conv1d_fn
from gdn.backends.ascendc.raw import COMPOSITE_FWD, LEGACY, RECURRENT, STABLE, RawOps
from gdn.backends.ascendc.recurrent import make_recurrent_ops
from gdn.calls import PREPARE, ConvCall
from standins import legacy as legacy_ext
from standins.support import compare_with_eager, legacy, stable, stable_ops

pytestmark = pytest.mark.single_op


class Recording:
    def __init__(self, route: str, op: str, fn: Callable, log: list[tuple[str, list[str]]]):
        self.contract, self.fn, self.log = contracts.contract(route, op), fn, log

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _, problems = contracts.violations(self.contract, args, kwargs)
        self.log.append((self.contract.op, problems))
        if problems:  # the real op raises here; the adapters' further calls would not happen
            raise contracts.ContractError("; ".join(problems))
        return self.fn(*args, **kwargs)


def recording(route: str, log: list) -> RawOps:
    ops = legacy_ext.ops() if route == LEGACY else stable_ops()
    return RawOps(route, types.SimpleNamespace(**{op: Recording(route, op, fn, log) for op, fn in ops.items()}))


def violations_of(log: list[tuple[str, list[str]]]) -> list[str]:
    return [p for _, problems in log for p in problems]


def chunk_step(ops: RawOps, *, composite: bool, cu: list[int] | None) -> None:
    """A training step with an initial state, through the adapters (K = V = 128, the chain's limits)."""
    gen = torch.Generator().manual_seed(0)
    B, T = (1, cu[-1]) if cu else (2, 80)
    N = len(cu) - 1 if cu else B
    inputs = dict(
        q=torch.randn(B, T, 2, 128, generator=gen),
        k=torch.randn(B, T, 2, 128, generator=gen),
        v=torch.randn(B, T, 4, 128, generator=gen),
        g=-torch.rand(B, T, 4, generator=gen) * 0.5,
        beta=torch.rand(B, T, 4, generator=gen),
        initial_state=torch.randn(N, 4, 128, 128, generator=gen) * 0.1,
        output_final_state=False,
        cu_seqlens=None if cu is None else torch.tensor(cu),
        use_qk_l2norm_in_kernel=True,
    )
    leaves = {k: v.requires_grad_() for k, v in inputs.items() if k in ("q", "k", "v", "g", "beta", "initial_state")}
    fn = make_chunk_gated_delta_rule(ChunkKernels.bind(ops, ops if composite else None))
    call = PREPARE["chunk_gated_delta_rule"](**inputs)
    o, _ = fn(call)
    o.float().square().sum().backward()
    assert all(t.grad is not None for t in leaves.values())


CHAIN = set(contracts.CONTRACTS[LEGACY]) - {"npu_causal_conv1d", "npu_causal_conv1d_bwd"}


@pytest.mark.parametrize("route", [LEGACY, STABLE])
@pytest.mark.parametrize("cu", [None, [0, 70, 71, 200]], ids=["dense", "varlen"])
def test_chunk_training_calls_keep_their_contracts(route: str, cu: list[int] | None) -> None:
    log: list = []
    chunk_step(recording(route, log), composite=False, cu=cu)
    assert violations_of(log) == []
    assert {op for op, _ in log} == CHAIN


def test_composite_forward_calls_keep_their_contracts() -> None:
    log: list = []
    chunk_step(recording(STABLE, log), composite=True, cu=[0, 70, 200])
    assert violations_of(log) == []
    assert {op for op, _ in log} == CHAIN - {"npu_chunk_fwd_o"} | {COMPOSITE_FWD}


@pytest.mark.parametrize("route", [LEGACY, STABLE])
def test_conv_calls_keep_their_contracts(route: str) -> None:
    log: list = []
    fn = make_causal_conv1d_fn(ConvKernels.bind(recording(route, log)))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, 20, generator=gen).requires_grad_()
    weight = torch.randn(64, 4, generator=gen).requires_grad_()
    fn(ConvCall(x, weight, None, "silu", initial_states=torch.randn(2, 64, 3, generator=gen))).sum().backward()
    pool = torch.randn(3, 64, 3, generator=gen)
    fn(
        ConvCall(
            torch.randn(64, 30, generator=gen),
            weight.detach(),
            None,
            "silu",
            query_start_loc=torch.tensor([0, 12, 30], dtype=torch.int32),
            conv_states=pool,
            cache_indices=torch.tensor([2, 0], dtype=torch.int32),
            has_initial_state=torch.tensor([True, False]),
        )
    )
    assert violations_of(log) == []
    forward = "npu_causal_conv1d_fn" if route == STABLE else "npu_causal_conv1d"
    assert {op for op, _ in log} == {forward, "npu_causal_conv1d_bwd"}


def test_recurrent_calls_keep_their_contract() -> None:
    log: list = []
    ops = recording(STABLE, log)
    decode = make_recurrent_ops(ops.get(RECURRENT))["fused_recurrent_gated_delta_rule"]
    gen = torch.Generator().manual_seed(0)
    inputs = dict(
        q=torch.randn(2, 3, 2, 128, generator=gen),
        k=torch.randn(2, 3, 2, 128, generator=gen),
        v=torch.randn(2, 3, 4, 128, generator=gen),
        g=-torch.rand(2, 3, 4, generator=gen),
        beta=torch.rand(2, 3, 4, generator=gen),
        initial_state=torch.randn(2, 4, 128, 128, generator=gen),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    call = PREPARE["fused_recurrent_gated_delta_rule"](**inputs)
    decode(call)
    assert violations_of(log) == []
    assert {op for op, _ in log} == {RECURRENT}


@pytest.mark.parametrize("route", [LEGACY, STABLE])
def test_every_contract_cites_its_source(route: str) -> None:
    for c in contracts.CONTRACTS[route].values():
        assert c.sources, c.op
        assert all(s.commit in (contracts.V26_6, contracts.MAIN, contracts.LATER) for s in c.sources), c.op
        assert c.arguments[0].name in c.schema


def state_inputs(gen: torch.Generator, *, final: bool) -> dict[str, Any]:
    cu = [0, 70, 71, 200]
    return dict(
        q=torch.randn(1, 200, 2, 128, generator=gen),
        k=torch.randn(1, 200, 2, 128, generator=gen),
        v=torch.randn(1, 200, 4, 128, generator=gen),
        g=-torch.rand(1, 200, 4, generator=gen) * 0.5,
        beta=torch.rand(1, 200, 4, generator=gen),
        initial_state=torch.randn(3, 4, 128, 128, generator=gen) * 0.1,
        output_final_state=final,
        cu_seqlens=torch.tensor(cu),
        use_qk_l2norm_in_kernel=True,
    )


GRADS = ("q", "k", "v", "g", "beta", "initial_state")


@pytest.mark.parametrize("route", [LEGACY, STABLE])
def test_initial_state_gradient_matches_eager(route: str) -> None:
    """bwd_dhu leaves dh0 uninitialised on both routes (the stand-ins return garbage there, as the
    real op does); the adapter's own dh0 must agree with eager."""
    ops = legacy() if route == LEGACY else stable()
    fn = make_chunk_gated_delta_rule(ChunkKernels.bind(ops))
    errors = compare_with_eager(
        "chunk_gated_delta_rule", fn, state_inputs(torch.Generator().manual_seed(3), final=False), GRADS
    )
    assert errors["dinitial_state"] < 1.2e-2, errors
    assert max(errors.values()) < 3e-2, errors


@pytest.mark.parametrize("route", [LEGACY, STABLE])
def test_final_state_gradient_is_refused_with_its_reason(route: str) -> None:
    """A loss on the final state needs dht, which bwd_dhu ignores: the route refuses the call with its
    reason (gdn.resolve then serves it elsewhere, tests/backends/ascendc/test_ascendc_generations.py), and a direct
    call raises rather than return gradients that miss dht."""
    ops = legacy() if route == LEGACY else stable()
    kernels = ChunkKernels.bind(ops)
    inputs = state_inputs(torch.Generator().manual_seed(4), final=True)
    args = {k: (v.requires_grad_() if k in GRADS else v) for k, v in inputs.items()}
    call = PREPARE["chunk_gated_delta_rule"](**args)
    reason = f"{BWD_DHU} ignores dht on this fla_npu: the final state cannot carry a gradient"
    assert refusal_of(kernels)(call) == reason
    with pytest.raises(contracts.ContractError, match="ignores dht"):
        make_chunk_gated_delta_rule(kernels)(call)
