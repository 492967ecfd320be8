"""state_v_first: the recurrent states in fla's value-first layout ([.., V, K], K contiguous; FlashInfer's
bf16 pools). Every backend that serves an op gives a value-first call the key-first call's answer: the
same outputs, the final state in the caller's layout (dense), the pool written in place in its own
layout, and for the chunk op the same gradients, the initial state's in its layout.

Each call is validated like the public op (gdn.calls.PREPARE), handed to one backend's implementation
and its result put in the public op's form (`Call.public_result`, as gdn.dispatch does). Without a CUDA
device the triton kernels run under the Triton interpreter.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import gdn
from gdn.calls import PREPARE
from gdn.resolve import backends, compute_mode_override
from implementations import implementation

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ("eager", "triton", "fla", "flashqla", "ascendc")
OPS = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule_update")
H, HV, K, V = 2, 4, 16, 8  # K != V: a layout mix-up cannot pass as the right shape


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)


def _value_first(state: torch.Tensor) -> torch.Tensor:
    """A key-first state's values stored value-first: [.., V, K], dense."""
    return state.transpose(-1, -2).contiguous()


def _inputs(op: str, gen: torch.Generator, K: int = K, V: int = V, dtype=torch.float32) -> dict[str, object]:
    T = 9
    args = dict(
        q=_randn(gen, 1, T, H, K).to(dtype),
        k=_randn(gen, 1, T, H, K).to(dtype),
        v=_randn(gen, 1, T, HV, V).to(dtype),
        g=-torch.rand(1, T, HV, generator=gen).to(DEVICE) * 0.5,
        beta=torch.rand(1, T, HV, generator=gen).to(DEVICE, dtype),
        cu_seqlens=torch.tensor([0, 2, 6, 9], dtype=torch.int32, device=DEVICE),
        use_qk_l2norm_in_kernel=True,
    )
    if op == "fused_recurrent_gated_delta_rule_update":
        args.update(ssm_pool=_randn(gen, 5, HV, K, V, scale=0.1), ssm_indices=_tensor([3, -1, 0]))
    else:
        args.update(initial_state=_randn(gen, 3, HV, K, V, scale=0.1), output_final_state=True)
    return args


def _taken(backend: str, op: str, gen: torch.Generator) -> dict[str, object]:
    """Key-first inputs the backend takes: K != V in fp32, else the shape a narrower backend serves
    (FlashQLA: bf16, K = V = 128; the values still tell the layouts apart)."""
    refusals = []
    for shape in (dict(), dict(K=128, V=128, dtype=torch.bfloat16)):
        args = _inputs(op, gen, **shape)
        refusal = backends()[backend].refusal(op, PREPARE[op](**args))
        if refusal is None:
            return args
        refusals.append(refusal)
    pytest.skip(f"{backend} refuses these calls: {refusals}")


def _tensor(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _state_name(op: str) -> str:
    return "ssm_pool" if op == "fused_recurrent_gated_delta_rule_update" else "initial_state"


def _run(impl, op: str, args: dict[str, object]) -> list[torch.Tensor]:
    """The public op's outputs, then the pool as the call left it."""
    call = PREPARE[op](**args)
    out = call.public_result(impl(call))
    outs = list(out) if isinstance(out, tuple) else [out]
    return outs + ([args["ssm_pool"]] if "ssm_pool" in args else [])


@pytest.mark.single_op
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_a_value_first_call_gives_the_key_first_answer_in_its_layout(backend, op, gen):
    impl = implementation(backend, op, DEVICE)
    key_first = _taken(backend, op, gen)
    name = _state_name(op)
    value_first = dict(key_first, **{name: _value_first(key_first[name]), "state_v_first": True})
    key_first[name] = key_first[name].clone()
    with torch.no_grad():
        expected, got = _run(impl, op, key_first), _run(impl, op, value_first)
    o, *states = got
    assert torch.allclose(o, expected[0], rtol=1e-5, atol=1e-5), f"output: max diff {(o - expected[0]).abs().max()}"
    assert len(states) == 1  # the final state, or the pool
    state, reference = states[0], expected[1]
    assert state.shape == (reference.shape[0], HV, *reference.shape[-2:][::-1])
    assert state.is_contiguous()  # the caller's layout, dense
    diff = (state - _value_first(reference)).abs().max()
    assert torch.allclose(state, _value_first(reference), rtol=1e-5, atol=1e-5), f"state: max diff {diff}"


@pytest.mark.single_op
@pytest.mark.parametrize("backend", ["eager", "triton"])
def test_chunk_gradients_of_a_value_first_state_are_in_its_layout(backend, gen):
    op = "chunk_gated_delta_rule"
    impl = implementation(backend, op, DEVICE)
    key_first = _inputs(op, gen)
    value_first = dict(key_first, initial_state=_value_first(key_first["initial_state"]), state_v_first=True)
    weights = (torch.randn(1, 9, HV, V, generator=gen).to(DEVICE), torch.randn(3, HV, K, V, generator=gen).to(DEVICE))

    def grads(args: dict[str, object], final_weight: torch.Tensor) -> list[torch.Tensor]:
        leaves = {n: args[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "g", "beta", "initial_state")}
        o, final = _run(impl, op, dict(args, **leaves))
        ((o * weights[0]).sum() + (final * final_weight).sum()).backward()
        return [leaves[n].grad for n in leaves]

    expected = grads(key_first, weights[1])
    got = grads(value_first, _value_first(weights[1]))
    expected[-1] = _value_first(expected[-1])
    for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), got, expected, strict=True):
        assert a.shape == b.shape, name
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), f"d{name}: max diff {(a - b).abs().max()}"


@pytest.mark.single_op
def test_the_public_ops_take_value_first_states(gen):
    """Through gdn's own ops (validation, resolution, the backend, the result in the caller's layout)."""
    for op in OPS:
        key_first = _inputs(op, gen)
        name = _state_name(op)
        value_first = dict(key_first, **{name: _value_first(key_first[name]), "state_v_first": True})
        with compute_mode_override("eager"), torch.no_grad():
            expected = getattr(gdn, op)(**key_first)
            got = getattr(gdn, op)(**value_first)
        if op == "fused_recurrent_gated_delta_rule_update":
            assert torch.equal(got, expected)
            assert torch.equal(value_first[name], _value_first(key_first[name]))
        else:
            assert torch.equal(got[0], expected[0])
            assert torch.equal(got[1], _value_first(expected[1]))


@pytest.mark.single_op
@pytest.mark.parametrize("op", OPS)
def test_a_state_in_the_other_layout_is_refused_by_name(op, gen):
    args = _inputs(op, gen)
    name = _state_name(op)
    with pytest.raises(ValueError, match=rf"argument '{name}' expected .*\[.*HV, V, K\] \(state_v_first"):
        PREPARE[op](**args, state_v_first=True)
    with pytest.raises(TypeError, match="argument 'state_v_first' expected a bool"):
        PREPARE[op](**dict(args, **{name: _value_first(args[name])}), state_v_first=1)


@pytest.mark.single_op
def test_a_prepared_decode_step_takes_a_value_first_pool(gen):
    """gdn.PreparedPoolDecode with state_v_first: each step writes the value-first pool as the key-first
    step writes its own, and gives the same outputs."""
    op = "fused_recurrent_gated_delta_rule_update"
    args = _inputs(op, gen)
    tokens = [args[n][:, :3].transpose(0, 1).contiguous() for n in ("q", "k", "v", "g", "beta")]
    key_first, indices = args["ssm_pool"], args["ssm_indices"]
    value_first = _value_first(key_first)
    with torch.no_grad():
        key_step = gdn.PreparedPoolDecode(*tokens, key_first, indices)
        value_step = gdn.PreparedPoolDecode(*tokens, value_first, indices, state_v_first=True)
        for _ in range(2):
            expected, got = key_step(*tokens, indices), value_step(*tokens, indices)
            assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), f"max diff {(got - expected).abs().max()}"
    assert torch.allclose(value_first, _value_first(key_first), rtol=1e-5, atol=1e-5)
