"""Eager causal conv1d (prefill, varlen with a state pool, decode) against a direct fp64 conv."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gdn
from reference import causal_conv, rel_err

pytestmark = pytest.mark.single_op


def conv_inputs(gen, B=2, D=24, T=19, W=4):
    return (
        torch.randn(B, D, T, generator=gen),
        torch.randn(D, W, generator=gen),
        torch.randn(D, generator=gen),
    )


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("W", [1, 2, 4])
def test_dense_matches_reference(activation, W, gen):
    x, w, b = conv_inputs(gen, W=W)
    out = gdn.causal_conv1d_fn(x, w, b, activation=activation)
    assert out.shape == x.shape
    assert rel_err(out, causal_conv(x, w, b, activation)) < 1e-6


def test_dense_initial_and_final_states(gen):
    x, w, b = conv_inputs(gen, T=2, W=4)  # shorter than the history: the final state mixes both
    hist = torch.randn(2, 24, 3, generator=gen)
    out, final = gdn.causal_conv1d_fn(x, w, b, activation="silu", initial_states=hist, return_final_states=True)
    assert rel_err(out, causal_conv(x, w, b, activation="silu", history=hist)) < 1e-6
    assert torch.equal(final, torch.cat([hist, x], dim=-1)[..., -3:])


def test_dense_gradients_match_autograd_conv(gen):
    x, w, b = conv_inputs(gen)
    hist = torch.randn(2, 24, 3, generator=gen)
    leaves = [t.clone().requires_grad_() for t in (x, w, b, hist)]
    ref_leaves = [t.clone().double().requires_grad_() for t in (x, w, b, hist)]
    up = torch.randn(2, 24, 19, generator=gen)
    (gdn.causal_conv1d_fn(*leaves[:3], activation="silu", initial_states=leaves[3]) * up).sum().backward()
    rx, rw, rb, rh = ref_leaves
    ref = F.silu(F.conv1d(torch.cat([rh, rx], -1), rw.unsqueeze(1), rb, groups=24))
    (ref * up.double()).sum().backward()
    for got, want in zip(leaves, ref_leaves, strict=True):
        assert rel_err(got.grad, want.grad) < 1e-6


def test_seq_idx_keeps_packed_sequences_apart(gen):
    x, w, b = conv_inputs(gen, B=1, T=20)
    seq_idx = torch.tensor([[0] * 7 + [1] * 1 + [2] * 12], dtype=torch.int32)
    out = gdn.causal_conv1d_fn(x, w, b, activation="silu", seq_idx=seq_idx)
    for s, e in ((0, 7), (7, 8), (8, 20)):
        assert rel_err(out[..., s:e], causal_conv(x[..., s:e], w, b, "silu")) < 1e-6


def test_varlen_reads_and_writes_the_pool(gen):
    D, W = 16, 4
    bounds = [0, 2, 2, 11, 30]
    x = torch.randn(D, 30, generator=gen)
    w, b = torch.randn(D, W, generator=gen), torch.randn(D, generator=gen)
    pool = torch.randn(6, D, W - 1, generator=gen)
    before = pool.clone()
    slots = torch.tensor([5, 1, -1, 0], dtype=torch.int32)
    has_init = torch.tensor([True, True, False, True])
    out = gdn.causal_conv1d_fn(
        x,
        w,
        b,
        activation="silu",
        query_start_loc=torch.tensor(bounds),
        conv_states=pool,
        cache_indices=slots,
        has_initial_state=has_init,
    )
    assert out.shape == x.shape
    for n in range(4):
        s, e, slot = bounds[n], bounds[n + 1], slots[n].item()
        hist = before[slot : slot + 1] if has_init[n] and slot >= 0 else torch.zeros(1, D, W - 1)
        if e > s:
            assert rel_err(out[:, s:e], causal_conv(x[None, :, s:e], w, b, "silu", history=hist)[0]) < 1e-6
        if slot >= 0:
            assert torch.equal(pool[slot], torch.cat([hist[0], x[:, s:e]], dim=-1)[:, -(W - 1) :])
    assert torch.equal(pool[[2, 3, 4]], before[[2, 3, 4]])  # rows no live index names stay bit-identical


@pytest.mark.parametrize("state_len", [3, 5])
def test_update_steps_equal_prefill(state_len, gen):
    """Decode token by token through a pool equals the prefill conv over the same tokens."""
    x, w, b = conv_inputs(gen, B=3, T=6, W=4)
    pool = torch.zeros(4, 24, state_len)
    indices = torch.tensor([3, 0, 1])
    outs = [gdn.causal_conv1d_update(x[..., t], pool, w, b, "silu", conv_state_indices=indices) for t in range(6)]
    assert rel_err(torch.stack(outs, dim=-1), causal_conv(x, w, b, activation="silu")) < 1e-6
    assert torch.equal(pool[indices, :, -min(state_len, 6) :], x[..., -min(state_len, 6) :])


def test_update_skips_padded_rows_and_takes_several_tokens(gen):
    x, w, _ = conv_inputs(gen, B=3, T=2, W=4)
    pool = torch.randn(5, 24, 3, generator=gen)
    before = pool.clone()
    indices = torch.tensor([4, -1, 2], dtype=torch.int32)
    out = gdn.causal_conv1d_update(x, pool, w, None, None, conv_state_indices=indices)
    for row, slot in ((0, 4), (2, 2)):
        want = causal_conv(x[row : row + 1], w, None, None, history=before[slot : slot + 1])[0]
        assert rel_err(out[row], want) < 1e-6
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(pool[[0, 1, 3]], before[[0, 1, 3]])


def test_update_without_indices_uses_batch_rows(gen):
    x, w, b = conv_inputs(gen, B=2, T=1, W=3)
    state = torch.randn(2, 24, 2, generator=gen)
    want = causal_conv(x, w, b, activation="silu", history=state.clone())
    assert rel_err(gdn.causal_conv1d_update(x[..., 0], state, w, b, "silu"), want[..., 0]) < 1e-6
