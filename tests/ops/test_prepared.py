"""A prepared decode step (gdn.PreparedPoolDecode) against the public pool update: the same outputs and
pool on fresh tokens, the same guards on bad indices, a clear error for a tensor that does not match
the prepared call, the triton kernel's own prepared step where it serves (no public call per token),
the public call in full elsewhere, torch.compile without graph breaks, and a CUDA graph that captures a
step.

Without a CUDA device the triton kernels run under the Triton interpreter, set before they are
imported."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

import gdn
from gdn import ops
from gdn.resolve import compute_mode_override
from pool_steps import DEVICE, HV, SLOTS, B, H, K, V, new_pool, tokens
from reference import rel_err

pytestmark = pytest.mark.single_op


def slots(gen, batch=B):
    """Distinct slots of the pool, one row a padding slot (-1)."""
    chosen = torch.randperm(SLOTS, generator=gen)[:batch].to(torch.int32)
    chosen[int(torch.randint(batch, (1,), generator=gen))] = -1
    return chosen.to(DEVICE)


@pytest.mark.parametrize("mode", ["triton", "eager"])
def test_prepared_steps_equal_the_public_call(mode, gen):
    pool = new_pool(gen)
    expected_pool = pool.clone()
    with torch.no_grad(), compute_mode_override(mode):
        step = gdn.PreparedPoolDecode(*tokens(gen), pool, slots(gen), use_qk_l2norm_in_kernel=True)
        assert step.route.startswith(mode)
        for _ in range(3):
            inputs, indices = tokens(gen), slots(gen)
            o = step(*inputs, indices)
            expected = gdn.fused_recurrent_gated_delta_rule_update(
                *inputs, expected_pool, indices, use_qk_l2norm_in_kernel=True
            )
            assert rel_err(o, expected) <= 1e-5
            assert rel_err(pool, expected_pool) <= 1e-5
            assert gdn.resolve.last_route() == step.route


def test_a_step_on_strided_tensors_equals_the_public_call(gen):
    """Tensors prepared non-contiguous (q a view of a wider buffer, indices every other entry): each step
    with the same strides gives the public call's answer."""
    pool = new_pool(gen)
    expected_pool = pool.clone()

    def strided(gen):
        q, k, v, g, beta = tokens(gen)
        wide = torch.randn(B, 1, H, 2 * K, generator=gen).to(DEVICE)[..., ::2]
        spread = torch.full((2 * B,), -1, dtype=torch.int32, device=DEVICE)
        spread[::2] = slots(gen)
        return (wide.copy_(q), k, v, g, beta), spread[::2]

    with torch.no_grad(), compute_mode_override("triton"):
        step = gdn.PreparedPoolDecode(*strided(gen)[0], pool, strided(gen)[1])
        for _ in range(2):
            inputs, indices = strided(gen)
            assert not inputs[0].is_contiguous() and not indices.is_contiguous()
            o = step(*inputs, indices)
            expected = gdn.fused_recurrent_gated_delta_rule_update(*inputs, expected_pool, indices)
            assert rel_err(o, expected) <= 1e-5 and rel_err(pool, expected_pool) <= 1e-5


def test_a_step_whose_tensors_do_not_match_the_prepared_ones_is_refused_by_name(gen):
    pool = torch.zeros(SLOTS, HV, K, V, device=DEVICE)
    q, k, v, g, beta = tokens(gen)
    indices = slots(gen)
    with torch.no_grad(), compute_mode_override("eager"):
        step = gdn.PreparedPoolDecode(q, k, v, g, beta, pool, indices)
        wider = torch.empty(B, 1, H, 2 * K, device=DEVICE)[..., ::2]  # k's shape, other strides
        with pytest.raises(ValueError, match=r"argument 'q' expected .*shape \[3, 1, 1, 16\].*got .*shape \[2, 1"):
            step(q[:2], k, v, g, beta, indices)
        with pytest.raises(ValueError, match=r"argument 'k' expected .*strides \(16, 16, 16, 1\).*got .*strides"):
            step(q, wider.copy_(k), v, g, beta, indices)
        with pytest.raises(ValueError, match=r"argument 'v' expected .*dtype torch.float32.*got .*torch.bfloat16"):
            step(q, k, v.bfloat16(), g, beta, indices)
        with pytest.raises(TypeError, match=r"argument 'ssm_indices' expected a tensor .*got list"):
            step(q, k, v, g, beta, indices.tolist())
        step(q, k, v, g, beta, indices)  # the prepared metadata still passes


def test_the_triton_step_makes_no_public_call_and_the_eager_one_does(gen, monkeypatch):
    public_calls = []
    public = ops.fused_recurrent_gated_delta_rule_update
    monkeypatch.setattr(
        ops,
        "fused_recurrent_gated_delta_rule_update",
        lambda *a, **kw: public_calls.append(1) or public(*a, **kw),
    )
    pool = torch.zeros(SLOTS, HV, K, V, device=DEVICE)
    with torch.no_grad():
        for mode, calls in (("triton", 0), ("eager", 2)):
            public_calls.clear()
            with compute_mode_override(mode):
                step = gdn.PreparedPoolDecode(*tokens(gen), pool, slots(gen))
                for _ in range(2):
                    step(*tokens(gen), slots(gen))
            assert len(public_calls) == calls, mode


def test_a_step_guards_indices_as_the_public_call(gen, monkeypatch):
    """triton: a repeated slot gives its rows NaN and leaves the pool untouched, checked on the device;
    eager, or GDN_VALUE_CHECKS=1 when preparing: the host check's error."""
    pool = new_pool(gen)
    before = pool.clone()
    repeated = torch.tensor([5, 2, 5], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        with compute_mode_override("triton"):
            step = gdn.PreparedPoolDecode(*tokens(gen), pool, slots(gen))
            pool.copy_(before)
            o = step(*tokens(gen), repeated)
        assert o[[0, 2]].isnan().all() and not o[1].isnan().any()
        assert torch.equal(pool[5], before[5]) and not torch.equal(pool[2], before[2])
        for mode, checks in (("eager", None), ("triton", "1")):
            if checks:
                monkeypatch.setenv("GDN_VALUE_CHECKS", checks)
            with compute_mode_override(mode):
                step = gdn.PreparedPoolDecode(*tokens(gen), pool, slots(gen))
                with pytest.raises(ValueError, match="distinct live slots"):
                    step(*tokens(gen), repeated)


def test_a_step_that_needs_gradients_is_served_as_the_public_call_serves_it(gen):
    """The triton kernel is forward only: the public call serves such a call eager, and so does a step."""
    pool = new_pool(gen)
    expected_pool = pool.clone()
    with compute_mode_override("triton"):
        with torch.no_grad():
            step = gdn.PreparedPoolDecode(*tokens(gen), pool, slots(gen))
        q, k, v, g, beta = tokens(gen)
        indices = slots(gen)
        o = step(q.requires_grad_(), k, v, g, beta, indices)
        expected = gdn.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, expected_pool, indices)
    assert o.grad_fn is not None and rel_err(o.detach(), expected.detach()) <= 1e-5
    o.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("mode", ["triton", "eager"])
def test_a_step_compiles_without_graph_breaks_and_equals_the_eager_call(mode, gen):
    """Inside torch.compile a step is the public op's custom op: one graph, the same answer."""
    pool = new_pool(gen)
    expected_pool = pool.clone()
    with torch.no_grad(), compute_mode_override(mode):
        step = gdn.PreparedPoolDecode(*tokens(gen), pool, slots(gen))
        inputs, indices = tokens(gen), slots(gen)
        explained = torch._dynamo.explain(lambda *a: step(*a))(*inputs, indices.clone())
        assert explained.graph_break_count == 0, explained.break_reasons
        pool.copy_(expected_pool)
        o = torch.compile(lambda *a: step(*a), backend="eager", fullgraph=True)(*inputs, indices)
        expected = gdn.fused_recurrent_gated_delta_rule_update(*inputs, expected_pool, indices)
    assert rel_err(o, expected) <= 1e-5 and rel_err(pool, expected_pool) <= 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_a_step_captured_in_a_cuda_graph_replays_new_tokens(gen):
    pool = new_pool(gen)
    expected_pool = pool.clone()
    static = [*tokens(gen), slots(gen)]
    with torch.no_grad(), compute_mode_override("triton"):
        step = gdn.PreparedPoolDecode(*static[:5], pool, static[5])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(*static)  # warm-up off the capture: compiles and finds the binary
        torch.cuda.current_stream().wait_stream(side)
        pool.copy_(expected_pool)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(*static)
        pool.copy_(expected_pool)
        for _ in range(3):
            fresh = [*tokens(gen), slots(gen)]
            for buffer, value in zip(static, fresh, strict=True):
                buffer.copy_(value)
            graph.replay()
            expected = gdn.fused_recurrent_gated_delta_rule_update(*fresh[:5], expected_pool, fresh[5])
            torch.cuda.synchronize()
            assert rel_err(out, expected) <= 1e-5
            assert rel_err(pool, expected_pool) <= 1e-5


@pytest.mark.parametrize("mode", ["triton", "eager"])
def test_preparing_runs_nothing_so_the_kernel_log_counts_only_the_steps(mode, gen):
    """Preparing validates, resolves and value-checks the call but runs no kernel: a log in force
    counts each step once and the preparation not at all."""
    from gdn import kernel_log
    from gdn.matrix.kernels import recording

    pool = new_pool(gen)
    cells_log = kernel_log.install(None)  # a cell's log is set aside while this one is in force
    try:
        with torch.no_grad(), compute_mode_override(mode), recording() as log:
            step = gdn.PreparedPoolDecode(*tokens(gen), pool, slots(gen), use_qk_l2norm_in_kernel=True)
            prepared = log.mark()
            for _ in range(2):
                step(*tokens(gen), slots(gen))
            stepped = log.since(prepared)
        assert sum(prepared.values()) == 0, prepared
        assert sum(stepped.values()) == 2, stepped
    finally:
        kernel_log.install(cells_log)
