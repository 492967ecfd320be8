"""The mini-GRPO family: a tiny random-init Qwen3.5 model (dense and MoE) samples G completions for each
of a few prompts, gets a toy reward, and takes one GRPO step (clipped-ratio loss, KL to a frozen
reference, entropy bonus). Switching the GDN backend must change nothing beyond the tolerances of
tests/grpo/compare.py, in padded batches and in packed (cu_seqlens) ones, for the actor and the
reference alike. Every available mode other than eager is compared against eager; unavailable ones
are skipped with the reason, except the modes GDN_EXPECT_MODES names (CI's kernels session expects
triton under the interpreter): a case of theirs that is not compared fails."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys

import pytest

import gdn
import gdn.backends.eager
from gdn.backends.base import Backend
from gdn.matrix.outcomes import COMPARISON
from grpo.backends import (
    EXPECT_ENV,
    comparison,
    describe,
    expected_modes,
    not_compared,
    other_modes,
    refused_ops,
    resolve_under,
    unserved_modules,
)
from grpo.compare import Tolerance, differences
from grpo.models import device
from grpo.run import TRANSFORMERS, Run, packing_blocker, run
from repo_paths import TESTS

if not expected_modes():  # a run that expects a mode compared fails without transformers
    pytest.importorskip("transformers", reason="the grpo family runs transformers' Qwen3.5 models")
pytestmark = pytest.mark.grpo

KINDS = ("dense", "moe")
# Against another backend: both layouts on the dense model, and the MoE model padded (its GDN layer is
# the same code in another class; the eager tests cover it packed). One test per backend, because the
# resolver probes the backend again in every test, and under the Triton interpreter that costs more
# than the runs.
BACKEND_CASES = (("dense", "padded"), ("dense", "packed"), ("moe", "padded"))


@functools.cache
def eager_run(kind: str, layout: str) -> Run:
    """The reference of every comparison, computed once per worker."""
    return run(kind, layout, "eager")


def report(title: str, lines: list[str]) -> None:
    print(title, *(f"  {line}" for line in lines), sep="\n")


def assert_same(got: Run, want: Run, tol: Tolerance, title: str) -> None:
    lines, bad = differences(got, want, tol)
    report(f"{title} (tolerance: {tol})", lines)
    assert not bad, f"{title}: " + "; ".join(bad)


@pytest.mark.parametrize("kind", KINDS)
def test_eager_backend_matches_transformers(kind):
    """gdn's eager ops in place of transformers' torch code: the same step to fp32 rounding, and the
    rollout (prefill and every cached decode step) samples the same tokens."""
    got = eager_run(kind, "padded")
    assert unserved_modules(got, resolve_under(gdn.resolve.EAGER, device())) == []
    assert 0 < got.step.clip_fraction < 1, "the loss must take both branches of the clip"
    theirs = run(kind, "padded", TRANSFORMERS)
    assert_same(got, theirs, Tolerance.for_backends({}), f"{kind}: eager vs transformers")


@pytest.mark.parametrize("kind", KINDS)
def test_packed_sequences_match_padded(kind):
    """The same rollout packed into one row with cu_seqlens trains exactly as the padded batch
    (transformers' own torch code cannot: 5.24 refuses, 5.14-5.17 leak state from one sequence into the
    next)."""
    blocker = packing_blocker(kind)
    if blocker:
        pytest.skip(f"not compared: {blocker}")
    packed = eager_run(kind, "packed")
    assert unserved_modules(packed, resolve_under(gdn.resolve.EAGER, device())) == []
    assert_same(packed, eager_run(kind, "padded"), Tolerance.for_backends({}), f"{kind}: packed vs padded (eager)")


@pytest.mark.parametrize("mode", other_modes())
def test_backend_matches_eager(mode, record_property):
    """Each mode but eager, on this cell's device, against eager: the ops it serves (the rest fall back
    to eager, as the output says), both models' GDN modules on them, every quantity of the step within
    the tolerance its probed accuracy allows. Packed sequences that a backend (NotImplementedError) or
    this transformers cannot run, and runs whose calls the backend refuses (a declared limit, such as
    FlashQLA's half-precision-only inputs against this fp32 step), are reported and make the test xfail,
    or skip when no case was compared (fail, if the mode is expected: an expected mode must also serve
    every op of the step, so a probe rejection or a refusal cannot hide it)."""
    dev = device()
    reason = gdn.resolve.backends()[mode].why_unavailable(dev.type)
    if reason:
        not_compared(mode, f"backend {mode} is unavailable on {dev.type}: {reason}")
    resolutions = resolve_under(mode, dev)
    report(f"{mode} against eager on {dev.type}; the ops resolved to:", describe(resolutions))
    # what is compared, whatever the verdict (a comparison whose ops fell back, or that left a case out,
    # must not pass under the name): each case stays "not reached" until the test compares it
    uncompared = {f"{kind}/{layout}": "the test stopped before it" for kind, layout in BACKEND_CASES}
    try:
        _compare_cases(mode, dev, resolutions, uncompared)
    finally:
        record_property(COMPARISON, json.dumps(comparison(mode, resolutions, uncompared)))


def _compare_cases(mode: str, dev, resolutions, uncompared: dict[str, str]) -> None:
    """test_backend_matches_eager's cases: compares each it can, leaving in `uncompared` those it cannot
    with the reason."""
    served = {op: res.backend for op, res in resolutions.items()}
    fell_back = [op for op, backend in served.items() if backend != mode]
    if len(fell_back) == len(served):
        not_compared(mode, f"backend {mode} serves none of the GDN ops on {dev.type} (all fell back to eager)")
    if fell_back and mode in expected_modes():
        pytest.fail(f"{EXPECT_ENV} expects {mode} to serve every op of the step; fell back: {', '.join(fell_back)}")
    tol = Tolerance.for_backends(served)
    failures = []
    for kind, layout in BACKEND_CASES:
        case, title = f"{kind}/{layout}", f"{kind}/{layout}: {mode} vs eager"
        blocker = packing_blocker(kind) if layout == "packed" else None
        if blocker:
            uncompared[case] = blocker
            report(f"{title}: NOT COMPARED, {blocker}", [])
            continue
        try:
            got = run(kind, layout, mode, replay=eager_run(kind, layout).rollout.sampled)
        except NotImplementedError as exc:
            if layout != "packed":
                raise
            uncompared[case] = f"backend {mode} cannot run packed sequences (cu_seqlens): {exc}"
            report(f"{title}: NOT COMPARED, {uncompared[case]}", [])
            continue
        refused = refused_ops(got, resolutions)
        if refused:
            uncompared[case] = f"backend {mode} refuses the step's calls: " + "; ".join(
                f"{op}: {why}" for op, why in refused.items()
            )
            report(f"{title}: NOT COMPARED, {uncompared[case]}", [])
            continue
        problems = unserved_modules(got, resolutions)
        lines, bad = differences(got, eager_run(kind, layout), tol)
        del uncompared[case]
        report(f"{title} (tolerance: {tol})", problems + lines)
        failures += [f"{title}: {line}" for line in problems + bad]
    assert not failures, "\n".join(failures)
    if len(uncompared) == len(BACKEND_CASES):
        not_compared(mode, "; ".join(dict.fromkeys(uncompared.values())))
    if uncompared:
        not_compared(mode, "; ".join(dict.fromkeys(uncompared.values())), pytest.xfail)


def test_a_backend_that_refused_every_call_of_an_op_is_not_compared():
    """An op whose backend refused every call of the run (eager served them, as designed) is named with
    the refusal: such a run compares nothing of that backend, so the case is reported as not compared
    instead of failing on the modules that ran eager. One call on the backend's route makes it compared."""
    flashqla = gdn.resolve.Resolution("chunk_gated_delta_rule", "cuda", "flashqla", "flashqla", "flashqla:0.1.3", False)
    flashqla.refusals["FlashQLA takes q, k, v all bfloat16 or all float16"] += 3
    conv = gdn.resolve.Resolution("causal_conv1d_fn", "cuda", "flashqla", "eager", "eager", False)
    calls = {"chunk_gated_delta_rule": {"eager": 2}, "causal_conv1d_fn": {"eager": 2}}
    got = Run(rollout=None, step=None, record={"modules": [{"id": 1, "calls": calls}]}, models={"actor": [1]})
    resolutions = {"chunk_gated_delta_rule": flashqla, "causal_conv1d_fn": conv}
    assert refused_ops(got, resolutions) == {
        "chunk_gated_delta_rule": "FlashQLA takes q, k, v all bfloat16 or all float16"
    }
    calls["chunk_gated_delta_rule"] = {"eager": 1, "flashqla:0.1.3": 1}
    assert refused_ops(got, resolutions) == {}


def test_an_expected_mode_that_is_not_compared_fails(monkeypatch):
    """A mode GDN_EXPECT_MODES names fails where it would skip, so a run meant to compare it (CI's kernels
    session, triton) cannot pass without comparing it; a misspelt name is an error rather than expecting nothing."""
    mode = other_modes()[0]
    monkeypatch.setenv(EXPECT_ENV, mode)
    with pytest.raises(pytest.fail.Exception, match=f"expects {mode} compared against eager, but it was not: gone"):
        not_compared(mode, "gone")
    monkeypatch.setenv(EXPECT_ENV, f"{mode}, no-such-mode")
    with pytest.raises(ValueError, match="no-such-mode"):
        expected_modes()


def test_comparison_rejects_a_backend_with_a_small_gate_error():
    """The tolerances are tight enough to matter: a chunk op whose decay is off by 5% (a wrong softplus
    or a lost chunk-boundary decay is larger) fails the comparison even at the loosest tolerance a probed
    backend gets (gdn.numeric_probe's default)."""
    eager_chunk = gdn.backends.eager.EAGER.implementation("chunk_gated_delta_rule")

    def skewed_chunk(call):
        return eager_chunk(dataclasses.replace(call, g=call.g * 1.05))

    gdn.register_backend(Backend("skewed", ops={"chunk_gated_delta_rule": skewed_chunk}, needs_probe=False))
    try:
        got = run("dense", "padded", "skewed", replay=eager_run("dense", "padded").rollout.sampled)
        tol = Tolerance.for_backends({"chunk_gated_delta_rule": "skewed"})
    finally:
        gdn.unregister_backend("skewed")
    lines, bad = differences(got, eager_run("dense", "padded"), tol)
    report("dense/padded: skewed vs eager", lines)
    assert bad, "a 5% gate error must fail the comparison"


def test_a_model_that_did_not_run_through_gdn_is_caught():
    """The served-modules check fails when the reference model bypassed the patch."""
    good = eager_run("dense", "padded")
    assert good.record is not None
    ref_ids = set(good.models["reference"])
    record = {**good.record, "modules": [m for m in good.record["modules"] if m["id"] not in ref_ids]}
    bypassed = Run(good.rollout, good.step, record, good.models)
    problems = unserved_modules(bypassed, resolve_under(gdn.resolve.EAGER, device()))
    assert len(problems) == len(ref_ids) * 2 and all(p.startswith("reference") for p in problems), problems


BASELINE_SCRIPT = """
import sys
import torch
try:  # from 5.25 transformers hands its GDN work to fla for inputs on a device fla serves: this CPU is
    # made one, as a GPU machine's device is (read when the modeling modules are imported, below)
    from transformers.integrations import hub_kernels
    devices = hub_kernels._PACKAGE_SUPPORTED_DEVICES
    devices["fla"] = (*devices["fla"], "cpu")
except (ImportError, AttributeError, KeyError):
    pass
from grpo.models import build, transformers_torch_code
ids = torch.tensor([[5, 9, 17, 3]])
with transformers_torch_code():
    build(sys.argv[1], 0, torch.device("cpu"))(ids)
try:
    build(sys.argv[1], 0, torch.device("cpu"))(ids)
except RuntimeError as exc:
    print("without:", exc)
"""


def test_the_transformers_baseline_is_its_torch_code_where_fla_imports():
    """On a GPU machine with fla installed, transformers hands its GDN ops to fla; the baseline must
    still be transformers' torch code. A stand-in fla whose kernels raise (tests/grpo/external_standins)
    is importable in a subprocess: the baseline runs, and the model built outside it reaches fla, so
    this transformers would otherwise have compared gdn with fla."""
    standins = TESTS / "grpo" / "external_standins"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(standins), str(TESTS), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", BASELINE_SCRIPT, "dense"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if "without: stand-in fla" not in done.stdout:
        # Up to 5.14 transformers takes fla only when CUDA is available: nothing to show on this machine.
        import transformers

        pytest.skip(f"transformers {transformers.__version__} does not hand GDN ops to fla on this machine")
