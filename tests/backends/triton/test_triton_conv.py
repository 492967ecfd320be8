"""The triton backend's causal conv1d kernels (prefill dense / varlen with a state pool, decode
update) against the eager backend, and what the GPU compiler makes of them.

Without a CUDA device the kernels run under the Triton interpreter (set before they are imported).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from gdn.backends.eager import EAGER
from gdn.backends.triton import conv
from reference import rel_err
from triton_harness import DEVICE, TOL, run, run_on_hopper_compiler

FN = "causal_conv1d_fn"
UPDATE = "causal_conv1d_update"


def both(op: str, *args, **kwargs):
    return run(getattr(conv, op), op, *args, **kwargs), run(EAGER.ops[op], op, *args, **kwargs)


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


def channel_last(x: torch.Tensor) -> torch.Tensor:
    """The same values in memory order [..., T, D], as a transposed projection output has them."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


# ---------------------------------------------------------------------------------------------------
# prefill, dense


@pytest.mark.shape_grid
@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@pytest.mark.parametrize(("W", "activation", "with_bias"), [(1, None, True), (2, "silu", False), (4, "swish", True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dense_matches_eager(layout, W, activation, with_bias, dtype, gen):
    B, D, T = 2, 24, 70  # T spans two token blocks; D is not a multiple of the channel block
    x = randn(gen, B, D, T, dtype=dtype)
    if layout == "channel_last":
        x = channel_last(x)
    weight, bias = randn(gen, D, W), (randn(gen, D) if with_bias else None)
    history = randn(gen, B, D, W - 1, dtype=dtype)
    kwargs = dict(initial_states=history, return_final_states=True)
    (out, final), (ref, ref_final) = both(FN, x, weight, bias, activation=activation, **kwargs)
    assert out.dtype == dtype and out.stride() == x.stride()  # the output keeps the input's layout
    assert rel_err(out, ref) <= TOL[dtype]
    assert torch.equal(final, ref_final)


@pytest.mark.single_op
def test_dense_without_history_and_short_rows(gen):
    x, weight = randn(gen, 3, 16, 2), randn(gen, 16, 4)  # T < W - 1: the final state is mostly zeros
    (out, final), (ref, ref_final) = both(FN, x, weight, None, activation="silu", return_final_states=True)
    assert rel_err(out, ref) <= 1e-5 and torch.equal(final, ref_final)
    out, ref = both(FN, x, weight)
    assert rel_err(out, ref) <= 1e-5


@pytest.mark.single_op
def test_seq_idx_keeps_packed_sequences_apart(gen):
    x, weight, bias = randn(gen, 2, 24, 20), randn(gen, 24, 4), randn(gen, 24)
    seq_idx = torch.tensor([[0] * 7 + [1] + [2] * 12, [5] * 3 + [6] * 17], dtype=torch.int32, device=DEVICE)
    history = randn(gen, 2, 24, 3)  # read by each row's first sequence only
    out, ref = both(FN, x, weight, bias, activation="silu", seq_idx=seq_idx, initial_states=history)
    assert rel_err(out, ref) <= 1e-5


# ---------------------------------------------------------------------------------------------------
# prefill, varlen against the pool


@pytest.mark.shape_grid
@pytest.mark.parametrize("layout", ["channel_first", "channel_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_varlen_reads_and_writes_the_pool(layout, dtype, gen):
    D, W = 20, 4
    # an empty sequence, sequences shorter than W - 1 (their final state mixes history and input), a
    # padded one (-1), and a last sequence of one token in a second token block
    bounds = [0, 2, 2, 11, 12, 69, 70]
    slots = torch.tensor([5, 1, -1, 7, 0, 6], dtype=torch.int32, device=DEVICE)
    has_init = torch.tensor([True, True, False, True, False, True], device=DEVICE)
    x = randn(gen, D, 70, dtype=dtype)
    if layout == "channel_last":
        x = channel_last(x)
    weight, bias = randn(gen, D, W), randn(gen, D)
    pool = randn(gen, 8, D, W - 1, dtype=dtype)
    before, eager_pool = pool.clone(), pool.clone()
    kwargs = dict(query_start_loc=torch.tensor(bounds, device=DEVICE), cache_indices=slots, has_initial_state=has_init)
    out = run(conv.causal_conv1d_fn, FN, x, weight, bias, activation="silu", conv_states=pool, **kwargs)
    ref = run(EAGER.ops[FN], FN, x, weight, bias, activation="silu", conv_states=eager_pool, **kwargs)
    assert out.stride() == x.stride()
    assert rel_err(out, ref) <= TOL[dtype]
    assert torch.equal(pool, eager_pool)
    assert torch.equal(pool[[2, 3, 4]], before[[2, 3, 4]])  # rows no live index names: bit-identical


@pytest.mark.single_op
def test_varlen_default_slots_no_flags_and_no_pool(gen):
    D, W = 16, 3
    bounds = torch.tensor([0, 5, 9, 30], device=DEVICE)
    x, weight = randn(gen, D, 30), randn(gen, D, W)
    pool = randn(gen, 4, D, W - 1)
    eager_pool = pool.clone()
    # cache_indices None: sequence n owns slot n; has_initial_state None: no history is read
    out = run(conv.causal_conv1d_fn, FN, x, weight, None, query_start_loc=bounds, conv_states=pool)
    ref = run(EAGER.ops[FN], FN, x, weight, None, query_start_loc=bounds, conv_states=eager_pool)
    assert rel_err(out, ref) <= 1e-5 and torch.equal(pool, eager_pool)
    out, ref = both(FN, x, weight, None, activation="silu", query_start_loc=bounds)
    assert rel_err(out, ref) <= 1e-5


# ---------------------------------------------------------------------------------------------------
# decode


@pytest.mark.shape_grid
@pytest.mark.parametrize("state_len", [3, 5])
@pytest.mark.parametrize("tokens", [None, 1, 3])  # None: x [B, D]
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_update_matches_eager_and_skips_padded_rows(state_len, tokens, dtype, gen):
    B, D, W = 3, 40, 4
    x = randn(gen, B, D, dtype=dtype) if tokens is None else randn(gen, B, D, tokens, dtype=dtype)
    weight, bias = randn(gen, D, W), randn(gen, D)
    pool = randn(gen, 5, D, state_len, dtype=dtype)
    before, eager_pool = pool.clone(), pool.clone()
    indices = torch.tensor([4, -1, 2], dtype=torch.int32, device=DEVICE)
    out = run(conv.causal_conv1d_update, UPDATE, x, pool, weight, bias, "silu", conv_state_indices=indices)
    ref = run(EAGER.ops[UPDATE], UPDATE, x, eager_pool, weight, bias, "silu", conv_state_indices=indices)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_err(out, ref) <= TOL[dtype]
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(pool, eager_pool)
    assert torch.equal(pool[[0, 1, 3]], before[[0, 1, 3]])


@pytest.mark.single_op
def test_update_steps_equal_prefill_and_rows_without_indices(gen):
    B, D, W, T = 2, 24, 4, 5
    x, weight, bias = randn(gen, B, D, T), randn(gen, D, W), randn(gen, D)
    state = torch.zeros(B, D, W - 1, device=DEVICE)  # no indices: row b is state b
    outs = [run(conv.causal_conv1d_update, UPDATE, x[..., t], state, weight, bias, "silu") for t in range(T)]
    ref, ref_final = run(EAGER.ops[FN], FN, x, weight, bias, activation="silu", return_final_states=True)
    assert rel_err(torch.stack(outs, dim=-1), ref) <= 1e-5
    assert torch.equal(state, ref_final)


@pytest.mark.single_op
def test_forward_only_refuses_inputs_that_need_gradients(gen):
    x, weight = randn(gen, 1, 8, 4), randn(gen, 8, 2).requires_grad_(True)
    with pytest.raises(NotImplementedError, match="weight require grad"):
        run(conv.causal_conv1d_fn, FN, x, weight)
    with pytest.raises(NotImplementedError, match="forward only"):
        run(conv.causal_conv1d_update, UPDATE, x[..., 0], torch.zeros(1, 8, 1, device=DEVICE), weight)
    with torch.no_grad():
        assert run(conv.causal_conv1d_fn, FN, x, weight).shape == x.shape


# ---------------------------------------------------------------------------------------------------
# the GPU compiler

CONV_SCENARIO = """
from gdn.backends.triton import conv
from gdn.calls import PREPARE

def launches(op, *args, **kwargs):
    prepared = PREPARE[op](*args, **kwargs)
    return record(conv, lambda: getattr(conv, op)(prepared))

D, W = 2048, 4
weight, bias = torch.randn(D, W, dtype=torch.bfloat16), torch.randn(D, dtype=torch.bfloat16)
pool = torch.zeros(8, D, W - 1, dtype=torch.bfloat16)

def varlen(T, transposed):
    x = torch.randn(T, D, dtype=torch.bfloat16).t() if transposed else torch.randn(D, T, dtype=torch.bfloat16)
    bounds, slots = torch.tensor([0, 1, T - 3, T]), torch.tensor([3, -1, 5])
    has_init = torch.tensor([True, True, False])
    return launches("causal_conv1d_fn", x, weight, bias, activation="silu", query_start_loc=bounds, conv_states=pool,
                    cache_indices=slots, has_initial_state=has_init)

def dense(T, transposed):
    x = torch.randn(2, T, D, dtype=torch.bfloat16).transpose(1, 2) if transposed else torch.randn(2, D, T)
    return launches("causal_conv1d_fn", x, weight, None, seq_idx=torch.zeros(2, T, dtype=torch.int32),
                    initial_states=torch.zeros(2, D, W - 1), return_final_states=True)

def update(L, transposed):  # x [B, D, L] has one layout
    x = torch.randn(4, D, L, dtype=torch.bfloat16)
    return launches("causal_conv1d_update", x, pool, weight, bias, "silu",
                    conv_state_indices=torch.tensor([0, -1, 2, 7], dtype=torch.int32))

RESULT["usage"], RESULT["keys"] = {}, {}
for make, lengths in ((varlen, (300, 301, 333)), (dense, (64, 65, 97)), (update, (1, 2, 16))):
    for transposed in (False, True) if make is not update else (False,):
        runs = [make(n, transposed) for n in lengths]
        for kernel, launched in runs[0].items():
            if launched:
                name = f"{make.__name__} {kernel} transposed={transposed}"
                RESULT["usage"][name] = compile_sm90(launched[0])
                RESULT["keys"][name] = len({launch_key(r[kernel][0]) for r in runs})
"""


@pytest.mark.single_op
def test_compiles_for_hopper_without_spills_and_one_binary_per_length():
    result = run_on_hopper_compiler(CONV_SCENARIO)
    for name, usage in result["usage"].items():
        assert usage["spill_bytes"] in (0, None), f"{name}: {usage}"
    changed = {name: n for name, n in result["keys"].items() if n != 1}
    assert not changed, f"a length changed a specialized argument: {changed}"
