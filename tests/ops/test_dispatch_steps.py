"""The public pool update's repeated calls (gdn.prepared): a call whose tensors repeat an earlier
validated call's metadata goes straight to the triton kernel's prepared step, and gives what eager
gives; the pool it is handed (not the one prepared) is the one read and written; the cache keeps no
pool alive; another mode, other metadata, host value checks on request and gradients take the full
path.

Without a CUDA device the triton kernels run under the Triton interpreter, set before they are
imported."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

import gdn
from gdn import dispatch, prepared
from gdn.resolve import compute_mode, compute_mode_override, last_route
from pool_steps import DEVICE, SLOTS, B, H, K, new_pool, tokens
from reference import rel_err

pytestmark = pytest.mark.single_op


def slots(gen):
    return torch.randperm(SLOTS, generator=gen)[:B].to(torch.int32).to(DEVICE)


@pytest.fixture
def served(monkeypatch):
    """The calls that went through validation and resolution (dispatch.serve)."""
    calls = []
    serve = dispatch.serve
    monkeypatch.setattr(dispatch, "serve", lambda *a, **kw: calls.append(a[0]) or serve(*a, **kw))
    monkeypatch.setattr(prepared, "_steps", {})
    monkeypatch.setattr(prepared, "_latest", {})
    return calls


def update(*args, **kwargs):
    return gdn.fused_recurrent_gated_delta_rule_update(*args, use_qk_l2norm_in_kernel=True, **kwargs)


def test_repeated_calls_take_the_prepared_step_and_equal_eager(gen, served):
    pool = new_pool(gen)
    expected_pool = pool.clone()
    with torch.no_grad():
        for _ in range(4):
            inputs, indices = tokens(gen), slots(gen)
            with compute_mode_override("triton"):
                o = update(*inputs, pool, indices)
                assert last_route().startswith("triton")
            with compute_mode_override("eager"):
                expected = update(*inputs, expected_pool, indices)
            assert rel_err(o, expected) <= 1e-5 and rel_err(pool, expected_pool) <= 1e-5
    # the triton calls: the first resolves the op, the second prepares its step, the rest are steps; the
    # eager backend has no prepared step
    assert len(served) == 2 + 4


def test_a_step_reads_and_writes_the_pool_it_is_handed(gen, served):
    first, second = new_pool(gen), new_pool(gen)
    with torch.no_grad(), compute_mode_override("triton"):
        for _ in range(2):  # resolved, then prepared
            update(*tokens(gen), first, slots(gen))
        before = first.clone()
        inputs, indices = tokens(gen), slots(gen)
        expected_pool = second.clone()
        o = update(*inputs, second, indices)
        assert len(served) == 2  # the call on the second pool was a step
        with compute_mode_override("eager"):
            expected = update(*inputs, expected_pool, indices)
    assert torch.equal(first, before)
    assert rel_err(o, expected) <= 1e-5 and rel_err(second, expected_pool) <= 1e-5


def test_the_steps_keep_no_pool_alive(gen, served):
    pool = new_pool(gen)
    with torch.no_grad(), compute_mode_override("triton"):
        for _ in range(2):
            update(*tokens(gen), pool, slots(gen))
    assert [step for step in prepared._steps.values() if step.run is not None]
    gone = weakref.ref(pool)
    del pool
    gc.collect()
    assert gone() is None


def test_another_mode_or_metadata_takes_the_full_path(gen, served):
    pool = new_pool(gen)
    with torch.no_grad():
        with compute_mode_override("triton"):
            for _ in range(2):
                update(*tokens(gen), pool, slots(gen))
        with compute_mode_override("eager"):
            update(*tokens(gen), pool, slots(gen))
            assert last_route() == "eager"
        with compute_mode_override("triton"):
            q, k, v, g, beta = tokens(gen)
            strided = torch.empty(B, 1, H, 2 * K, device=DEVICE)[..., ::2].copy_(q)
            indices = slots(gen)
            o = update(strided, k, v, g, beta, pool.clone(), indices)
            expected = update(q, k, v, g, beta, pool.clone(), indices)
    assert len(served) == 4  # triton twice, eager, strided q (then the dense call is a step)
    assert rel_err(o, expected) <= 1e-5


def test_host_value_checks_on_request_run_on_every_call(gen, served, monkeypatch):
    pool = new_pool(gen)
    repeated = torch.tensor([5, 2, 5], dtype=torch.int32, device=DEVICE)
    with torch.no_grad(), compute_mode_override("triton"):
        for _ in range(2):
            update(*tokens(gen), pool, slots(gen))
        o = update(*tokens(gen), pool, repeated)  # a step: the kernel refuses the repeated slot's rows
        assert len(served) == 2
        assert o[[0, 2]].isnan().all() and not o[1].isnan().any()
        monkeypatch.setenv("GDN_VALUE_CHECKS", "1")
        update(*tokens(gen), pool, slots(gen))
        with pytest.raises(ValueError, match="distinct live slots"):
            update(*tokens(gen), pool, repeated)


def test_a_call_that_needs_gradients_takes_the_full_path(gen, served):
    pool = new_pool(gen)
    with compute_mode_override("triton"):
        with torch.no_grad():
            update(*tokens(gen), pool, slots(gen))
        q, k, v, g, beta = tokens(gen)
        o = update(q.requires_grad_(), k, v, g, beta, pool, slots(gen))
    assert last_route() == "eager" and o.grad_fn is not None
    o.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_an_option_of_another_type_is_validated_again(gen, served):
    """A flag and the integer 1 are equal in Python, but only the flag is a valid option."""
    pool = new_pool(gen)
    with torch.no_grad(), compute_mode_override("triton"):
        for _ in range(2):  # resolved, then prepared
            gdn.fused_recurrent_gated_delta_rule_update(*tokens(gen), pool, slots(gen), 1, None, True)
        with pytest.raises(TypeError, match="'use_qk_l2norm_in_kernel' expected a bool, got int"):
            gdn.fused_recurrent_gated_delta_rule_update(*tokens(gen), pool, slots(gen), 1, None, 1)
        with pytest.raises(TypeError, match="'scale' expected None or a positive real number, got bool"):
            gdn.fused_recurrent_gated_delta_rule_update(*tokens(gen), pool, slots(gen), True, None, True)
    assert len(served) == 4


def test_calls_that_repeat_the_latest_step_build_no_key(gen, served, monkeypatch):
    """A serving loop repeats one call's metadata on every layer and token: such a call is checked
    against the op's latest step, with no key built and hashed; calls of two batch compositions in turn
    each take their own step, and every answer is eager's."""
    keys = []
    key_metadata = prepared.metadata  # read only to build a key
    monkeypatch.setattr(prepared, "metadata", lambda *a: keys.append(compute_mode()) or key_metadata(*a))
    pool = new_pool(gen)
    expected_pool = pool.clone()
    calls = []
    with torch.no_grad():
        with compute_mode_override("triton"):
            for batch in (B, B, B, B, B - 1, B, B - 1, B - 1):
                inputs = [t[:batch] for t in tokens(gen)]
                indices = slots(gen)[:batch]
                calls.append((inputs, indices, update(*inputs, pool, indices)))
        with compute_mode_override("eager"):
            for inputs, indices, o in calls:
                assert rel_err(o, update(*inputs, expected_pool, indices)) <= 1e-5
    assert rel_err(pool, expected_pool) <= 1e-5
    # the first call resolves the op (no key: nothing decided yet), the second builds a key to prepare
    # the step; then the same composition builds no key, another one builds a key to prepare its step,
    # then one to find it whenever the composition changes
    assert keys.count("triton") == 1 + 3
    assert len(served) == 3 + 8  # triton: resolved, two compositions prepared; eager has no step


def test_a_compiled_decode_loop_takes_the_prepared_step(gen, served):
    """Inside torch.compile the pool update is a custom op; when it runs, its repeated calls take the
    prepared step as eager ones do, and give eager's answer."""
    pool = new_pool(gen)
    expected_pool = pool.clone()
    compiled = torch.compile(update, backend="eager", fullgraph=True)
    with torch.no_grad():
        for _ in range(4):
            inputs, indices = tokens(gen), slots(gen)
            with compute_mode_override("triton"):
                o = compiled(*inputs, pool, indices)
            with compute_mode_override("eager"):
                expected = update(*inputs, expected_pool, indices)
            assert rel_err(o, expected) <= 1e-5 and rel_err(pool, expected_pool) <= 1e-5
    triton_calls = len(served) - 4  # the eager calls have no step
    assert triton_calls == 2, "resolved, then prepared; the rest are steps"


def test_the_served_call_carries_its_route_and_whether_the_kernel_guards_the_values(gen):
    """The full path hands the step cache and PreparedPoolDecode what they keep: the route that served
    the call (the one the route record reports) and whether its kernel guards the values the host
    checks read (the triton pool update does, eager does not)."""
    op = "fused_recurrent_gated_delta_rule_update"
    pool = new_pool(gen)
    with torch.no_grad():
        for mode, guards in (("triton", True), ("eager", False)):
            with compute_mode_override(mode):
                served = dispatch.serve(op, (*tokens(gen), pool, slots(gen)), {"use_qk_l2norm_in_kernel": True})
                assert served.route == last_route() and served.route.startswith(mode)
                assert served.kernel_guards is guards
                assert served.backend == mode and served.resolution.op == op
