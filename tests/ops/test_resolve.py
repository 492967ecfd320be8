"""Backend resolution: gdn_compute_mode, the registry, numeric probes that reject finite-but-wrong
backends, fallback to eager, strict mode, caching, log-once and the decision records."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

import gdn
import gdn.numeric_probe as numeric_probe
import gdn.resolve as resolver
from gdn.backends.base import Backend
from gdn.backends.eager import EAGER
from gdn.calls import PREPARE

pytestmark = pytest.mark.single_op

OP = "chunk_gated_delta_rule"
OTHER_OP = "l2norm"
CPU = torch.device("cpu")
_eager_chunk = EAGER.ops[OP]


# ---------------------------------------------------------------------------------------------------
# isolation


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The probe's tensors are tiny: intra-op threads only add OpenMP spin-waits (and, on a busy
    machine, oversubscription that makes each probe 10-100x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """Every test starts and ends with: no mode override, no env mode/strict, no cached decisions,
    and only the backends that were registered before it."""
    monkeypatch.delenv(resolver.MODE_ENV, raising=False)
    monkeypatch.delenv(resolver.STRICT_ENV, raising=False)
    gdn.set_compute_mode(None)
    resolver.reset()
    before = set(resolver.backends())
    yield
    gdn.set_compute_mode(None)
    for name in set(resolver.backends()) - before:
        gdn.unregister_backend(name)
    resolver.reset()


# ---------------------------------------------------------------------------------------------------
# helpers


class Recorder:
    """Wraps an implementation and counts its calls."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def _anchor(q):
    # A real kernel is wrapped in an autograd.Function, so its output is part of the graph even when
    # it is wrong; a zero-valued term keeps these stand-ins differentiable without changing values.
    return 0.0 * q.sum()


def _zeros(call):
    o, state = _eager_chunk(call)
    a = _anchor(call.q)
    return torch.zeros_like(o) + a, None if state is None else torch.zeros_like(state) + a


def _scaled(call):
    o, state = _eager_chunk(call)
    return o * 1.01, None if state is None else state * 1.01


def _raises(call):
    raise RuntimeError("kernel exploded: illegal memory access")


def _nan(call):
    o, state = _eager_chunk(call)
    return o * float("nan"), None if state is None else state * float("nan")


# kind -> (implementation, what the rejection reason must mention)
WRONG = {
    "zeros": (_zeros, "all zeros"),
    "scaled": (_scaled, "rel err"),
    "raises": (_raises, "raised"),
    "nan": (_nan, "NaN"),
}
# the actual cause of the raising backend must reach the reason and the strict-mode error
CAUSE = {"raises": "kernel exploded"}


def make_inputs(seed=0, B=1, T=20, H=1, HV=2, K=8, V=8):
    gen = torch.Generator().manual_seed(seed)
    return dict(
        q=torch.randn(B, T, H, K, generator=gen),
        k=torch.randn(B, T, H, K, generator=gen),
        v=torch.randn(B, T, HV, V, generator=gen),
        g=-torch.rand(B, T, HV, generator=gen) * 0.5,
        beta=torch.rand(B, T, HV, generator=gen),
        initial_state=torch.randn(B, HV, K, V, generator=gen) * 0.1,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )


def eager_reference(op, inputs):
    """What eager computes for these user-level arguments, bypassing resolution entirely."""
    call = PREPARE[op](**inputs)
    return EAGER.ops[op](call)


def run_chunk(inputs=None):
    inputs = make_inputs() if inputs is None else inputs
    out, state = gdn.chunk_gated_delta_rule(**inputs)
    ref_out, ref_state = eager_reference(OP, inputs)
    return (out, state), (ref_out, ref_state)


def assert_is_eager_output(got, ref):
    out, state = got
    ref_out, ref_state = ref
    assert torch.isfinite(out).all() and torch.isfinite(state).all()
    assert out.abs().amax() > 0
    torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(state, ref_state, rtol=1e-6, atol=1e-7)


def record_of(op):
    found = [r for r in gdn.resolutions() if r["op"] == op]
    assert len(found) == 1, found
    return found[0]


def op_log_records(caplog, op):
    return [r for r in caplog.records if r.name == "gdn" and r.getMessage().startswith(f"gdn: {op} on ")]


def wrong_backend(kind, **extra):
    impl = Recorder(WRONG[kind][0])
    return Backend(name="wrong", ops={OP: impl}, **extra), impl


def good_backend(**extra):
    impl = Recorder(_eager_chunk)
    backend = Backend(name="good", ops={OP: impl}, route=lambda op: "good:route", **extra)
    return backend, impl


# ---------------------------------------------------------------------------------------------------
# gdn_compute_mode


def test_default_mode_is_auto():
    assert gdn.compute_mode() == "auto"
    gdn.l2norm(torch.randn(2, 8))
    assert record_of(OTHER_OP)["requested_mode"] == "auto"


def test_empty_env_means_auto(monkeypatch):
    monkeypatch.setenv("GDN_COMPUTE_MODE", "")
    assert gdn.compute_mode() == "auto"


def test_env_sets_mode(monkeypatch):
    monkeypatch.setenv("GDN_COMPUTE_MODE", "eager")
    assert gdn.compute_mode() == "eager"
    gdn.l2norm(torch.randn(2, 8))
    rec = record_of(OTHER_OP)
    assert rec["requested_mode"] == "eager"
    assert rec["backend"] == "eager"


def test_set_compute_mode_overrides_env_and_none_returns_to_env(monkeypatch):
    backend, _ = good_backend()
    gdn.register_backend(backend)
    monkeypatch.setenv("GDN_COMPUTE_MODE", "good")
    assert gdn.compute_mode() == "good"
    gdn.set_compute_mode("eager")
    assert gdn.compute_mode() == "eager"
    gdn.set_compute_mode(None)
    assert gdn.compute_mode() == "good"
    monkeypatch.delenv("GDN_COMPUTE_MODE")
    assert gdn.compute_mode() == "auto"


def test_set_compute_mode_overrides_an_invalid_env(monkeypatch):
    monkeypatch.setenv("GDN_COMPUTE_MODE", "nonsense")
    gdn.set_compute_mode("eager")
    assert gdn.compute_mode() == "eager"


def test_unknown_mode_from_env_raises_naming_source_and_valid_modes(monkeypatch):
    monkeypatch.setenv("GDN_COMPUTE_MODE", "tpu-magic")
    with pytest.raises(ValueError) as excinfo:
        gdn.compute_mode()
    msg = str(excinfo.value)
    assert "GDN_COMPUTE_MODE" in msg
    assert "tpu-magic" in msg
    assert "'auto'" in msg and "'eager'" in msg
    # the ops refuse too, rather than silently running something
    with pytest.raises(ValueError, match="GDN_COMPUTE_MODE"):
        gdn.l2norm(torch.randn(2, 8))
    assert gdn.resolutions() == []


def test_unknown_mode_from_set_compute_mode_raises_and_keeps_previous_mode():
    gdn.set_compute_mode("eager")
    with pytest.raises(ValueError) as excinfo:
        gdn.set_compute_mode("tpu-magic")
    msg = str(excinfo.value)
    assert "set_compute_mode" in msg
    assert "tpu-magic" in msg
    assert "'auto'" in msg and "'eager'" in msg
    assert gdn.compute_mode() == "eager"


def test_registered_backend_becomes_a_mode():
    assert "good" not in gdn.modes()
    backend, _ = good_backend()
    gdn.register_backend(backend)
    assert gdn.modes()[0] == "auto"
    assert {"eager", "good"} <= set(gdn.modes())
    gdn.set_compute_mode("good")
    assert gdn.compute_mode() == "good"


# ---------------------------------------------------------------------------------------------------
# wrong backends are rejected by the probe and eager runs instead


def _check_probe_rejection(rec, requested_mode, kind):
    assert rec["op"] == OP
    assert rec["device"] == "cpu"
    assert rec["requested_mode"] == requested_mode
    assert rec["backend"] == "eager"
    assert rec["route"] == "eager"
    assert rec["strict"] is False
    assert rec["probe"] is None  # eager is the oracle: it is never probed
    assert len(rec["rejected"]) == 1, rec["rejected"]
    rej = rec["rejected"][0]
    assert rej["backend"] == "wrong"
    assert rej["route"] == "wrong"
    assert rej["reason"].startswith("numeric probe failed")
    assert WRONG[kind][1] in rej["reason"]
    if kind in CAUSE:
        assert CAUSE[kind] in rej["reason"]
    probe = rej["probe"]
    assert probe["passed"] is False
    assert isinstance(probe["seed"], int)
    assert probe["tolerance"] == numeric_probe.DEFAULT_TOLERANCE
    assert WRONG[kind][1] in probe["reason"]
    return rej


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_wrong_backend_requested_explicitly_is_rejected_and_eager_runs(kind, caplog):
    caplog.set_level(logging.INFO, logger="gdn")
    backend, impl = wrong_backend(kind)
    gdn.register_backend(backend)
    gdn.set_compute_mode("wrong")

    got, ref = run_chunk()

    assert_is_eager_output(got, ref)
    assert impl.calls == 1  # the probe's single (failing) case; the op call itself ran eager
    _check_probe_rejection(record_of(OP), "wrong", kind)
    [log_record] = op_log_records(caplog, OP)
    assert log_record.levelno == logging.WARNING
    assert "wrong rejected" in log_record.getMessage()
    assert WRONG[kind][1] in log_record.getMessage()


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_wrong_backend_first_in_auto_is_rejected_and_eager_runs(kind):
    backend, impl = wrong_backend(kind, auto_rank={"cpu": 0})
    gdn.register_backend(backend)
    assert gdn.compute_mode() == "auto"

    got, ref = run_chunk()

    assert_is_eager_output(got, ref)
    assert impl.calls == 1
    _check_probe_rejection(record_of(OP), "auto", kind)


def test_scaled_backend_probe_records_the_relative_error():
    backend, _ = wrong_backend("scaled")
    gdn.register_backend(backend)
    gdn.set_compute_mode("wrong")
    run_chunk()
    probe = record_of(OP)["rejected"][0]["probe"]
    assert probe["rel_err"]
    assert probe["max_rel_err"] == pytest.approx(0.01, rel=1e-3)
    assert "dense.out0" in probe["rel_err"]


def test_probe_tolerance_of_the_backend_is_used():
    # 1 % off passes when the backend declares a 5 % tolerance for the op
    backend, _ = wrong_backend("scaled", probe_tolerance={OP: 0.05})
    gdn.register_backend(backend)
    gdn.set_compute_mode("wrong")
    out, _ = gdn.chunk_gated_delta_rule(**make_inputs())
    ref_out, _ = eager_reference(OP, make_inputs())
    rec = record_of(OP)
    assert rec["backend"] == "wrong"
    assert rec["rejected"] == []
    assert rec["probe"]["passed"] is True
    assert rec["probe"]["tolerance"] == 0.05
    torch.testing.assert_close(out, ref_out * 1.01)


def test_wrong_backend_ranked_for_another_device_is_not_tried_on_cpu():
    backend, impl = wrong_backend("zeros", auto_rank={"cuda": 0})
    gdn.register_backend(backend)
    got, ref = run_chunk()
    assert_is_eager_output(got, ref)
    assert impl.calls == 0
    rec = record_of(OP)
    assert rec["backend"] == "eager"
    assert rec["rejected"] == []


@pytest.mark.parametrize("kind", ["zeros", "nan"])
def test_probe_names_a_bad_forward_even_without_autograd_graph(kind):
    def detached(call):
        o, state = _eager_chunk(call)
        fill = 0.0 if kind == "zeros" else float("nan")
        return torch.full_like(o.detach(), fill), torch.full_like(state.detach(), fill)

    report = numeric_probe.probe_op(OP, detached, CPU, eager=_eager_chunk)
    assert report.passed is False
    assert WRONG[kind][1] in report.reason


@pytest.mark.parametrize("op", ["fused_recurrent_gated_delta_rule_update", "fused_recurrent_gated_delta_rule"])
def test_probe_rejects_a_decode_kernel_wrong_only_for_one_token_steps(op):
    """A decode step (one token per sequence) may run its own kernel path: the probe has a case of it,
    so a backend right for longer calls and wrong there is rejected, by that case."""
    eager = EAGER.ops[op]

    def wrong_steps(call):
        result = eager(call)
        if call.shapes.T != 1:
            return result
        o = result[0] if isinstance(result, tuple) else result
        bad = o * 1.5
        return (bad, *result[1:]) if isinstance(result, tuple) else bad

    report = numeric_probe.probe_op(op, wrong_steps, CPU, with_grad=False, eager=eager)
    assert report.passed is False
    assert report.reason.startswith("pool_step." if op.endswith("_update") else "step."), report.reason


# ---------------------------------------------------------------------------------------------------
# a correct backend is chosen


@pytest.mark.parametrize("mode", ["auto", "good"])
def test_correct_backend_passes_probe_and_is_chosen(mode):
    backend, impl = good_backend(auto_rank={"cpu": 0})
    gdn.register_backend(backend)
    gdn.set_compute_mode(mode)

    got, ref = run_chunk()

    assert_is_eager_output(got, ref)
    rec = record_of(OP)
    assert rec["requested_mode"] == mode
    assert rec["device"] == "cpu"
    assert rec["backend"] == "good"
    assert rec["route"] == "good:route"
    assert rec["rejected"] == []
    assert rec["probe"]["passed"] is True
    assert rec["probe"]["reason"] is None
    assert rec["probe"]["max_rel_err"] is not None and rec["probe"]["max_rel_err"] < 1e-6
    assert isinstance(rec["probe"]["seed"], int)
    # the probe ran the backend, and then so did the op call
    assert impl.calls >= 2


def test_good_backend_ranked_before_wrong_one_wins_in_auto():
    good, _ = good_backend(auto_rank={"cpu": 0})
    wrong, wrong_impl = wrong_backend("zeros", auto_rank={"cpu": 1})
    gdn.register_backend(wrong)
    gdn.register_backend(good)
    run_chunk()
    assert record_of(OP)["backend"] == "good"
    assert wrong_impl.calls == 0


def test_auto_falls_through_a_wrong_backend_to_a_good_one():
    wrong, wrong_impl = wrong_backend("scaled", auto_rank={"cpu": 0})
    good, _ = good_backend(auto_rank={"cpu": 1})
    gdn.register_backend(good)
    gdn.register_backend(wrong)
    got, ref = run_chunk()
    assert_is_eager_output(got, ref)
    rec = record_of(OP)
    assert rec["backend"] == "good"
    assert rec["route"] == "good:route"
    assert [r["backend"] for r in rec["rejected"]] == ["wrong"]
    assert "rel err" in rec["rejected"][0]["reason"]
    assert wrong_impl.calls == 1


def test_backend_missing_an_op_is_rejected_for_that_op_only():
    backend, _ = good_backend(auto_rank={"cpu": 0})
    gdn.register_backend(backend)
    gdn.set_compute_mode("good")
    x = torch.randn(3, 16)
    torch.testing.assert_close(gdn.l2norm(x), eager_reference(OTHER_OP, dict(x=x)))
    rec = record_of(OTHER_OP)
    assert rec["backend"] == "eager"
    assert rec["rejected"][0]["backend"] == "good"
    assert f"does not implement {OTHER_OP}" in rec["rejected"][0]["reason"]


# ---------------------------------------------------------------------------------------------------
# strict mode


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_strict_explicit_wrong_backend_raises_with_the_cause(kind, monkeypatch):
    monkeypatch.setenv("GDN_STRICT", "1")
    backend, _ = wrong_backend(kind)
    gdn.register_backend(backend)
    gdn.set_compute_mode("wrong")
    with pytest.raises(gdn.GdnBackendError) as excinfo:
        gdn.chunk_gated_delta_rule(**make_inputs())
    msg = str(excinfo.value)
    assert "'wrong'" in msg
    assert OP in msg
    assert WRONG[kind][1] in msg
    if kind in CAUSE:
        assert CAUSE[kind] in msg
    assert "GDN_STRICT" in msg
    assert gdn.resolutions() == []  # a failed decision is not cached


def test_strict_auto_available_but_wrong_backend_raises(monkeypatch):
    monkeypatch.setenv("GDN_STRICT", "1")
    backend, _ = wrong_backend("scaled", auto_rank={"cpu": 0})
    gdn.register_backend(backend)
    with pytest.raises(gdn.GdnBackendError, match="rel err"):
        gdn.chunk_gated_delta_rule(**make_inputs())


def test_strict_auto_skips_unavailable_backend_without_raising(monkeypatch):
    monkeypatch.setenv("GDN_STRICT", "1")
    impl = Recorder(_eager_chunk)
    gdn.register_backend(Backend(name="gpuonly", ops={OP: impl}, check=lambda dev: "needs a GPU", auto_rank={"cpu": 0}))
    got, ref = run_chunk()
    assert_is_eager_output(got, ref)
    assert impl.calls == 0
    rec = record_of(OP)
    assert rec["strict"] is True
    assert rec["backend"] == "eager"
    assert rec["rejected"] == [{"backend": "gpuonly", "route": None, "reason": "needs a GPU", "probe": None}]


def test_strict_explicit_unavailable_backend_raises(monkeypatch):
    monkeypatch.setenv("GDN_STRICT", "1")
    gdn.register_backend(Backend(name="gpuonly", ops={OP: _eager_chunk}, check=lambda dev: "needs a GPU"))
    gdn.set_compute_mode("gpuonly")
    with pytest.raises(gdn.GdnBackendError, match="needs a GPU"):
        gdn.chunk_gated_delta_rule(**make_inputs())


def test_strict_explicit_correct_backend_does_not_raise(monkeypatch):
    monkeypatch.setenv("GDN_STRICT", "1")
    backend, _ = good_backend()
    gdn.register_backend(backend)
    gdn.set_compute_mode("good")
    run_chunk()
    rec = record_of(OP)
    assert rec["backend"] == "good"
    assert rec["strict"] is True


def test_non_strict_explicit_unavailable_backend_falls_back():
    gdn.register_backend(Backend(name="gpuonly", ops={OP: _eager_chunk}, check=lambda dev: "needs a GPU"))
    gdn.set_compute_mode("gpuonly")
    got, ref = run_chunk()
    assert_is_eager_output(got, ref)
    rec = record_of(OP)
    assert rec["backend"] == "eager"
    assert rec["rejected"][0]["reason"] == "needs a GPU"


# ---------------------------------------------------------------------------------------------------
# unavailable backends


@pytest.mark.parametrize("mode", ["auto", "broken"])
def test_loader_import_error_is_a_rejection_reason_not_a_crash(mode):
    loads = []

    def loader():
        loads.append(1)
        raise ImportError("no module named foo")

    gdn.register_backend(Backend(name="broken", loader=loader, auto_rank={"cpu": 0}))
    gdn.set_compute_mode(mode)
    got, ref = run_chunk()
    assert_is_eager_output(got, ref)
    rec = record_of(OP)
    assert rec["backend"] == "eager"
    [rej] = rec["rejected"]
    assert rej["backend"] == "broken"
    assert "ImportError" in rej["reason"]
    assert "no module named foo" in rej["reason"]
    assert rej["probe"] is None
    # a different op does not retry the failed import
    gdn.l2norm(torch.randn(2, 8))
    assert "no module named foo" in record_of(OTHER_OP)["rejected"][0]["reason"]
    assert len(loads) == 1


@pytest.mark.parametrize("mode", ["auto", "cudaonly"])
def test_backend_not_serving_cpu_is_rejected_naming_devices(mode):
    impl = Recorder(_eager_chunk)
    gdn.register_backend(Backend(name="cudaonly", ops={OP: impl}, devices=("cuda",), auto_rank={"cpu": 0}))
    gdn.set_compute_mode(mode)
    got, ref = run_chunk()
    assert_is_eager_output(got, ref)
    assert impl.calls == 0
    [rej] = record_of(OP)["rejected"]
    assert rej["backend"] == "cudaonly"
    assert "devices" in rej["reason"]
    assert "cuda" in rej["reason"] and "cpu" in rej["reason"]


# ---------------------------------------------------------------------------------------------------
# caching and log-once


def test_wrong_backend_is_probed_and_logged_once_per_decision(caplog):
    caplog.set_level(logging.INFO, logger="gdn")
    backend, impl = wrong_backend("zeros", auto_rank={"cpu": 0})
    gdn.register_backend(backend)
    inputs = make_inputs()

    first, _ = gdn.chunk_gated_delta_rule(**inputs)
    second, _ = gdn.chunk_gated_delta_rule(**inputs)

    assert impl.calls == 1
    assert torch.equal(first, second)
    assert len(op_log_records(caplog, OP)) == 1
    assert len(gdn.resolutions()) == 1

    # a different op is a separate decision, logged separately
    gdn.l2norm(torch.randn(2, 8))
    gdn.l2norm(torch.randn(2, 8))
    assert len(op_log_records(caplog, OTHER_OP)) == 1
    assert len(op_log_records(caplog, OP)) == 1
    assert sorted(r["op"] for r in gdn.resolutions()) == sorted([OP, OTHER_OP])
    assert impl.calls == 1


def test_good_backend_probe_runs_once_and_is_logged_once(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="gdn")
    probes = Recorder(numeric_probe.probe_op)
    monkeypatch.setattr(numeric_probe, "probe_op", probes)
    backend, impl = good_backend(auto_rank={"cpu": 0})
    gdn.register_backend(backend)
    inputs = make_inputs()

    gdn.chunk_gated_delta_rule(**inputs)
    after_first = impl.calls
    gdn.chunk_gated_delta_rule(**inputs)

    assert probes.calls == 1
    assert impl.calls == after_first + 1  # the second call only ran the op, no new probe
    [log_record] = op_log_records(caplog, OP)
    assert log_record.levelno == logging.INFO
    assert "good:route" in log_record.getMessage()

    # reset() forgets the decision: the next call probes and logs again
    resolver.reset()
    gdn.chunk_gated_delta_rule(**inputs)
    assert probes.calls == 2
    assert len(op_log_records(caplog, OP)) == 2


def test_changing_mode_is_a_separate_decision(caplog):
    caplog.set_level(logging.INFO, logger="gdn")
    backend, _ = good_backend()
    gdn.register_backend(backend)
    run_chunk()
    gdn.set_compute_mode("good")
    run_chunk()
    run_chunk()
    by_mode = {r["requested_mode"]: r["backend"] for r in gdn.resolutions() if r["op"] == OP}
    assert by_mode == {"auto": "eager", "good": "good"}
    assert len(op_log_records(caplog, OP)) == 2


def test_registering_a_backend_invalidates_cached_decisions():
    run_chunk()
    assert record_of(OP)["backend"] == "eager"
    backend, _ = good_backend(auto_rank={"cpu": 0})
    gdn.register_backend(backend)
    assert gdn.resolutions() == []
    run_chunk()
    assert record_of(OP)["backend"] == "good"


# ---------------------------------------------------------------------------------------------------
# records


def test_resolutions_are_json_serialisable():
    wrong, _ = wrong_backend("nan", auto_rank={"cpu": 0})
    gdn.register_backend(wrong)
    gdn.register_backend(
        Backend(name="gpuonly", ops={OP: _eager_chunk}, check=lambda dev: "needs a GPU", auto_rank={"cpu": 1})
    )
    run_chunk()
    gdn.l2norm(torch.randn(2, 8))
    records = gdn.resolutions()
    assert len(records) == 2
    text = json.dumps(records, allow_nan=False)
    assert json.loads(text) == records
    rec = record_of(OP)
    assert [r["backend"] for r in rec["rejected"]] == ["wrong", "gpuonly"]
    assert {"op", "device", "requested_mode", "backend", "route", "strict", "probe", "rejected"} <= set(rec)


def test_a_record_says_why_each_backend_that_was_never_tried_was_not():
    """Registered backends outside the candidates: not ranked for the device in auto, serving other
    devices, or not the requested mode; none of them is loaded to say so."""
    gdn.register_backend(Backend(name="gpuonly", ops={OP: _eager_chunk}, devices=("cuda",), auto_rank={"cuda": 0}))
    gdn.register_backend(Backend(name="offrank", ops={OP: _eager_chunk}, auto_rank={"npu": 3}))
    run_chunk()
    passed_over = {r["backend"]: r["reason"] for r in record_of(OP)["not_candidates"]}
    assert passed_over["gpuonly"] == "serves cuda, not cpu"
    assert passed_over["offrank"] == "auto tries it on npu only; GDN_COMPUTE_MODE=offrank selects it"
    assert passed_over["triton"] == "auto tries it on cuda, npu only; GDN_COMPUTE_MODE=triton selects it"
    assert "eager" not in passed_over
    resolver.reset()
    gdn.set_compute_mode("eager")
    run_chunk()
    passed_over = {r["backend"]: r["reason"] for r in record_of(OP)["not_candidates"]}
    assert set(passed_over) == set(resolver.backends()) - {"eager"}
    assert set(passed_over.values()) == {"not requested: compute mode eager"}


# ---------------------------------------------------------------------------------------------------
# registry


def test_register_refuses_duplicate_names_unless_replace():
    first, _ = good_backend()
    second, _ = good_backend()
    gdn.register_backend(first)
    with pytest.raises(ValueError, match="already registered"):
        gdn.register_backend(second)
    assert resolver.backends()["good"] is first
    gdn.register_backend(second, replace=True)
    assert resolver.backends()["good"] is second


def test_register_refuses_auto():
    with pytest.raises(ValueError, match="auto"):
        gdn.register_backend(Backend(name="auto", ops={}))
    assert "auto" not in resolver.backends()


def test_eager_cannot_be_unregistered_or_shadowed_by_accident():
    with pytest.raises(ValueError, match="eager"):
        gdn.unregister_backend("eager")
    assert resolver.backends()["eager"] is EAGER
    with pytest.raises(ValueError, match="already registered"):
        gdn.register_backend(Backend(name="eager", ops={}))
    assert resolver.backends()["eager"] is EAGER


def test_unregister_removes_the_mode():
    backend, _ = good_backend()
    gdn.register_backend(backend)
    assert "good" in gdn.modes()
    gdn.unregister_backend("good")
    assert "good" not in gdn.modes()
    with pytest.raises(ValueError):
        gdn.set_compute_mode("good")


def test_unregistering_the_selected_mode_does_not_leave_a_bare_keyerror():
    backend, _ = good_backend()
    gdn.register_backend(backend)
    gdn.set_compute_mode("good")
    gdn.unregister_backend("good")
    x = torch.randn(2, 8)
    try:
        out = gdn.l2norm(x)
    except ValueError as exc:  # acceptable: a clear error naming the stale mode
        assert "good" in str(exc)
    else:  # acceptable too: the override was dropped with the backend
        assert gdn.compute_mode() != "good"
        torch.testing.assert_close(out, eager_reference(OTHER_OP, dict(x=x)))


# ---------------------------------------------------------------------------------------------------
# forward-only backends (inference kernels)


def test_forward_only_backend_serves_inference_and_leaves_training_calls_to_eager(caplog):
    calls = []

    def inference_l2norm(call):
        if torch.is_grad_enabled() and call.x.requires_grad:
            raise NotImplementedError("forward only")
        calls.append(call.x.shape)
        return EAGER.ops[OTHER_OP](call)

    backend = Backend(name="infer", ops={OTHER_OP: inference_l2norm}, forward_only=frozenset({OTHER_OP}))
    gdn.register_backend(backend)
    gdn.set_compute_mode("infer")
    x = torch.randn(3, 16)
    with caplog.at_level(logging.INFO, logger="gdn"):
        y = gdn.l2norm(x)  # no gradient needed: the backend runs
        leaf = x.clone().requires_grad_()
        gdn.l2norm(leaf).sum().backward()  # needs gradients: eager runs this call
        gdn.l2norm(x.clone().requires_grad_()).sum().backward()
    rec = record_of(OTHER_OP)
    assert rec["backend"] == "infer" and rec["forward_only"] is True and rec["probe"]["passed"] is True
    assert not any(k.startswith("dx") for k in rec["probe"]["rel_err"]), "probed without gradients"
    assert len(calls) == 1 + 1  # the probe's forward and the inference call
    torch.testing.assert_close(y, eager_reference(OTHER_OP, dict(x=x)))
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    fallback_lines = [r for r in caplog.records if "forward-only" in r.getMessage()]
    assert len(fallback_lines) == 1


# ---------------------------------------------------------------------------------------------------
# per-call refusals


class Refusing(Backend):
    """Refuses calls of more than 100 tokens."""

    def refusal(self, op, call):
        T = call.shapes.T
        return f"T = {T} is past 100" if T > 100 else None


def test_a_refused_call_is_served_by_the_next_candidate_and_recorded(caplog):
    caplog.set_level(logging.WARNING, logger="gdn")
    impl = Recorder(_eager_chunk)
    gdn.register_backend(Refusing(name="refusing", ops={OP: impl}, auto_rank={"cpu": 0}))
    good, good_impl = good_backend(auto_rank={"cpu": 1})
    gdn.register_backend(good)
    resolver.resolve(OP, CPU)
    probe = record_of(OP)["probe"]
    # the probe compared the case it takes (dense, T = 80) and recorded the other; its fallback case
    # (packed, without the final state) runs only where every case before it was refused
    assert probe["passed"] is True and "dense.out0" in probe["rel_err"]
    assert probe["refused"] == {"varlen": "T = 130 is past 100"}
    calls = impl.calls
    run_chunk(make_inputs(T=120))  # the first refusal decides (and probes) the next candidate
    good_calls = good_impl.calls
    got, ref = run_chunk(make_inputs(T=120))
    assert_is_eager_output(got, ref)
    assert (impl.calls, good_impl.calls - good_calls) == (calls, 1)
    run_chunk(make_inputs(T=20))
    assert impl.calls == calls + 1  # a call it takes is its own
    rec = record_of(OP)
    assert rec["backend"] == "refusing"
    assert rec["refusals"] == [{"reason": "T = 120 is past 100", "count": 2, "served_by": "good:route"}]
    refused = [r.getMessage() for r in caplog.records if "refused a call" in r.getMessage()]
    assert refused == [f"gdn: {OP} on cpu: refusing refused a call (T = 120 is past 100); good:route serves it"]
    assert json.loads(json.dumps(gdn.resolutions()))  # the record stays JSON-able


def test_strict_mode_raises_on_a_refused_call_naming_the_reason(monkeypatch):
    gdn.register_backend(Refusing(name="refusing", ops={OP: _eager_chunk}, auto_rank={"cpu": 0}))
    monkeypatch.setenv(resolver.STRICT_ENV, "1")
    with pytest.raises(gdn.GdnBackendError, match=r"backend 'refusing' refused the call \(T = 120 is past 100\)"):
        run_chunk(make_inputs(T=120))


def test_a_probe_whose_every_case_is_refused_fails():
    class RefusesAll(Backend):
        def refusal(self, op, call):
            return "no call at all"

    gdn.register_backend(RefusesAll(name="refuses-all", ops={OP: _eager_chunk}, auto_rank={"cpu": 0}))
    run_chunk()
    rec = record_of(OP)
    assert rec["backend"] == "eager"
    [rejected] = rec["rejected"]
    assert rejected["reason"].startswith("numeric probe failed: every case refused: dense: no call at all")


def test_the_npu_backend_raises_strict_errors_without_importing_the_resolver():
    """Errors and strict mode sit below the resolver, so the AscendC backend (which raises them) does not
    close an import circle through gdn.resolve, gdn.ops and the numeric probe."""
    code = (
        "import sys, gdn.backends.ascendc.backend\n"
        "print(sorted(m for m in ('gdn.resolve', 'gdn.ops', 'gdn.numeric_probe') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert gdn.GdnBackendError is resolver.GdnBackendError  # the public name is the one the resolver raises


def test_probe_outside_the_limits_puts_the_refusal_on_record():
    """A backend that refuses K != 32: the probe's case at K = V = 16 is refused, with the reason on
    record, and never reaches the kernel."""

    def refuse_small(call):
        K = call.shapes.K
        return None if K == 32 else f"takes K = 32 only, got K = {K}"

    seen = []

    def kernel(call):
        seen.append(call.shapes.K)
        return _eager_chunk(call)

    report = numeric_probe.probe_op(OP, kernel, CPU, eager=_eager_chunk, refusal=refuse_small, outside_limits=(16, 16))
    assert report.passed is True
    assert report.refused == {"dense at K=16, V=16": "takes K = 32 only, got K = 16"}
    assert 16 not in seen and seen


def test_probe_outside_the_limits_fails_a_kernel_that_takes_the_shape_and_gets_it_wrong():
    """Where the refusal misses a limit, the case reaches the kernel and is compared: a kernel wrong at
    that shape fails the probe instead of serving it."""

    def wrong_below_32(call):
        o, state = _eager_chunk(call)
        return (o * 2, state) if call.shapes.K < 32 else (o, state)

    assert numeric_probe.probe_op(OP, wrong_below_32, CPU, eager=_eager_chunk).passed is True
    report = numeric_probe.probe_op(OP, wrong_below_32, CPU, eager=_eager_chunk, outside_limits=(16, 16))
    assert report.passed is False and report.reason.startswith("dense at K=16, V=16.out0: rel err")


def test_probe_without_compile_ahead_computes_each_reference_only_for_a_case_it_runs(monkeypatch):
    """With nothing compiling meanwhile, a case's eager reference is computed when the case runs: a
    backend that fails its first case costs one reference, not one per case."""
    events = []
    collect = numeric_probe._collect

    def collecting(op, fn, case, device):
        events.append("reference" if fn is _eager_chunk else "kernel")
        return collect(op, fn, case, device)

    monkeypatch.setattr(numeric_probe, "_collect", collecting)

    def doubled(call):
        return tuple(None if t is None else t * 2 for t in _eager_chunk(call))

    report = numeric_probe.probe_op(OP, doubled, CPU, eager=_eager_chunk)
    assert not report.passed and "rel err" in report.reason, report.reason
    assert events == ["reference", "kernel"]


def test_probe_hands_every_taken_case_to_the_backends_compile_ahead_once_before_running_any(monkeypatch):
    """A backend that compiles ahead gets the validated calls of all the probe's cases it takes (its
    refused ones left out) in one batch, before the first case runs: their binaries compile together,
    and the cases' eager references are computed by what it is handed to run meanwhile."""
    events = []

    def kernel(call):
        events.append(("run", call.shapes.K))
        return _eager_chunk(call)

    def compile_ahead(op, calls, meanwhile):
        events.append(("ahead", op, [(c.shapes.K, c.cu_seqlens is None) for c in calls]))
        meanwhile()
        events.append("compiled")

    collect = numeric_probe._collect

    def collecting(op, fn, case, device):
        events.append(("collect", "kernel" if fn is kernel else "reference"))
        return collect(op, fn, case, device)

    monkeypatch.setattr(numeric_probe, "_collect", collecting)

    def refuse_small(op, call):
        return None if call.shapes.K == 32 else f"takes K = 32 only, got K = {call.shapes.K}"

    backend = Backend(name="good", ops={OP: kernel}, compile_ahead=compile_ahead, probe_outside_limits=(16, 16))
    backend.refusal = refuse_small
    gdn.register_backend(backend)
    gdn.set_compute_mode("good")
    assert resolver.resolve(OP, CPU).backend == "good"
    assert events[0] == ("ahead", OP, [(32, True), (32, False)])
    assert events[1:4] == [("collect", "reference"), ("collect", "reference"), "compiled"]
    assert events[4:] == [("collect", "kernel"), ("run", 32)] * 2


def test_the_first_call_of_an_op_is_probed_in_its_own_class():
    """The public call resolves the op with itself as the probe's model: the gated-delta cases take its
    dtype, heads, head dims and states (so a compiling backend builds no binary that call does not
    launch: a training call's has neither an initial nor a final state); a half-precision class gets the
    probe tolerance of its precision, recorded with the class."""
    seen = []

    def kernel(call):
        seen.append((call.q.dtype, call.shapes.H, call.shapes.HV, call.shapes.K, call.shapes.V, call.initial_state))
        return _eager_chunk(call)

    gdn.register_backend(Backend(name="good", ops={OP: kernel}, probe_tolerance={OP: 1e-4}))
    gdn.set_compute_mode("good")
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 40, 3, 24, generator=gen, dtype=torch.float64).bfloat16() for _ in range(2))
    v = torch.randn(1, 40, 6, 40, generator=gen).bfloat16()
    g, beta = -torch.rand(1, 40, 6, generator=gen), torch.rand(1, 40, 6, generator=gen).bfloat16()
    gdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    probed, served = seen[:-1], seen[-1]
    assert {case[:5] for case in probed} == {(torch.bfloat16, 3, 6, 24, 40)} == {served[:5]}
    assert len(probed) == 2 and all(case[5] is None for case in probed)  # dense and packed, no states
    probe = resolver.resolve(OP, CPU).probe
    assert probe["passed"] and probe["tolerance"] == numeric_probe.HALF_PRECISION_TOLERANCE[OP][torch.bfloat16]
    assert probe["inputs"] == {
        "dtype": "bfloat16",
        "H": 3,
        "HV": 6,
        "K": 24,
        "V": 40,
        "state_dtype": None,
        "l2norm": True,
        "initial_state": False,
        "final_state": False,
    }


def test_a_call_that_normalises_q_and_k_itself_is_probed_with_unit_norm_q_and_k():
    """A call without the in-kernel l2norm (the caller normalised q and k, as a model whose layer runs
    l2norm first does) is probed with unit-norm q and k: with raw Gaussian ones of 128 dims the delta
    rule's state overflows and every backend, eager included, gives Inf or NaN."""
    gdn.register_backend(Backend(name="good", ops={OP: _eager_chunk}))
    gdn.set_compute_mode("good")
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(1, 20, 1, 128, generator=gen), dim=-1) for _ in range(2))
    v, g, beta = torch.randn(1, 20, 2, 128, generator=gen), -torch.rand(1, 20, 2, generator=gen), torch.rand(1, 20, 2)
    o, _ = gdn.chunk_gated_delta_rule(q, k, v, g, beta)
    resolution = resolver.resolve(OP, CPU)
    assert resolution.backend == "good" and resolution.probe["passed"], resolution.record()
    assert resolution.probe["inputs"]["l2norm"] is False and resolution.probe["inputs"]["K"] == 128
    assert torch.isfinite(o).all()
