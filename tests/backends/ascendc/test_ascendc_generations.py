"""Each fla_npu API generation, as the stand-in packages reproduce it, in a process of its own (torch.ops
registrations are process-global): which route serves each op and why every other route was not
taken, in gdn.resolutions(), in the backend's plan and in the probe manifest; the ops through those
routes (the 26.6 dispatcher, the 26.10 composite) agreeing with eager; decisions logged once; the
broken stable conv rejected by the numeric probe and the fallback used; GDN_STRICT=1 refusing the
degraded ops.

On a real NPU cell the same scenarios run against the stand-ins (they need no NPU); the real wheels
are covered by the probe family there (tests/matrix/test_manifest.py).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

from standins import harness, profiles

pytestmark = pytest.mark.probe

CHUNK, CONV = "chunk_gated_delta_rule", "causal_conv1d_fn"
RECURRENT, POOL = "fused_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule_update"
LEGACY, STABLE, COMPOSITE = "ascendc:legacy-torch-ops", "ascendc:stable-api", "ascendc:composite-fwd"
NO_LOADER = "fla_npu has no load_legacy_torch_ops(): a 26.6-style wheel"
NOT_SHIPPED = "torch.ops.npu holds no fla_npu ops (legacy extension not shipped: FileNotFoundError: not find"
NO_COMPOSITE = "fla_npu.ops.ascendc has no npu_chunk_gated_delta_rule_fwd"
NO_RECURRENT = "lacks torch.ops.npu.npu_recurrent_gated_delta_rule"
PREFERRED = "also available; ascendc:stable-api is preferred"
PROBE_FAILED = "numeric conv probe failed: ones.out: all zeros where the reference is not"
# every stand-in generation follows an fla_npu older than fla_npu #312, whose bwd_dhu ignores dht
NO_DHT = "npu_chunk_gated_delta_rule_bwd_dhu ignores dht on this fla_npu: the final state cannot carry a gradient"

# run -> (stand-in profile, extra environment). Each run is a process of its own, so runs combine
# what can share one: GDN_NPU_FUSED_FWD=1 without the composite rides with the broken stable conv.
RUNS = {
    "26.6": ("26.6", {}),
    "26.6-on-a-cuda-machine": ("26.6", {}),
    "26.6-on-an-npu-machine": ("26.6", {}),
    "26.10-composite": ("26.10-composite", {}),
    "26.10-broken-conv-fused-fwd-1": ("26.10-broken-conv", {"GDN_NPU_FUSED_FWD": "1"}),
    "26.10-broken-conv-no-legacy": ("26.10-broken-conv-no-legacy", {}),
    "strict": ("26.10-broken-conv-no-legacy", {"GDN_STRICT": "1", "GDN_NPU_FUSED_FWD": "1"}),
}

# run -> op -> (route, {rejected route: start of its reason})
EXPECTED: dict[str, dict[str, tuple[str | None, dict[str, str]]]] = {
    "26.6": {
        CHUNK: (LEGACY, {STABLE: NO_LOADER, COMPOSITE: "npu_chunk_gated_delta_rule_fwd needs the stable API"}),
        CONV: (LEGACY, {STABLE: NO_LOADER}),
        RECURRENT: (None, {STABLE: NO_LOADER, LEGACY: NO_RECURRENT}),
        POOL: (None, {STABLE: NO_LOADER, LEGACY: NO_RECURRENT}),
    },
    "26.10-composite": {
        CHUNK: (COMPOSITE, {LEGACY: NOT_SHIPPED}),
        CONV: (STABLE, {LEGACY: NOT_SHIPPED}),
        RECURRENT: (STABLE, {LEGACY: NOT_SHIPPED}),
        POOL: (STABLE, {LEGACY: NOT_SHIPPED}),
    },
    "26.10-broken-conv-fused-fwd-1": {
        CHUNK: (STABLE, {COMPOSITE: NO_COMPOSITE, LEGACY: PREFERRED}),
        CONV: (LEGACY, {STABLE: PROBE_FAILED}),
        RECURRENT: (STABLE, {LEGACY: NO_RECURRENT}),
        POOL: (STABLE, {LEGACY: NO_RECURRENT}),
    },
    "26.10-broken-conv-no-legacy": {
        CHUNK: (STABLE, {COMPOSITE: NO_COMPOSITE, LEGACY: NOT_SHIPPED}),
        CONV: (None, {STABLE: PROBE_FAILED, LEGACY: NOT_SHIPPED}),
        RECURRENT: (STABLE, {LEGACY: NOT_SHIPPED}),
        POOL: (STABLE, {LEGACY: NOT_SHIPPED}),
    },
}
EXPECTED["strict"] = EXPECTED["26.10-broken-conv-no-legacy"]
# runs whose child believes it is on an accelerator machine (tests/standins/machines), so that a CPU
# machine shows what the scenarios meet on a GPU or an NPU cell
MACHINES = {
    "26.6-on-a-cuda-machine": harness.TESTS / "standins" / "machines" / "cuda",
    "26.6-on-an-npu-machine": harness.TESTS / "standins" / "machines" / "npu",
}
EXPECTED |= {name: EXPECTED[RUNS[name][0]] for name in MACHINES}

# run -> check name -> verdict, in the probe manifest
CHECKS = {
    "26.6": {
        "fla_npu_api": "ok",
        "fla_npu_legacy_extension": "ok",
        "fla_npu_composite_fwd": "n/a",
        f"ascendc_route:{CHUNK}": "ok",
        f"ascendc_route:{RECURRENT}": "warn",
    },
    "26.10-composite": {
        "fla_npu_api": "ok",
        "fla_npu_legacy_extension": "warn",
        "fla_npu_composite_fwd": "ok",
        f"ascendc_route:{CHUNK}": "ok",
    },
    "26.10-broken-conv-fused-fwd-1": {
        "fla_npu_legacy_extension": "ok",
        "fla_npu_composite_fwd": "warn",
        f"ascendc_route:{CONV}": "warn",
    },
    "26.10-broken-conv-no-legacy": {"fla_npu_composite_fwd": "n/a", f"ascendc_route:{CONV}": "fail"},
    "strict": {f"ascendc_route:{CONV}": "fail", "fla_npu_composite_fwd": "fail"},
}
CHECKS |= {name: CHECKS[RUNS[name][0]] for name in MACHINES}
PARITY_TOL = 1.2e-2  # the kernels run in bf16 (see test_ascendc_adapters.py)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    cache: dict[str, dict[str, Any]] = {}

    def get(run: str) -> dict[str, Any]:
        if run not in cache:
            profile, extra = RUNS[run]
            env = harness.environment(tmp_path_factory.mktemp(run), profile, **extra)
            if run in MACHINES:
                env["PYTHONPATH"] = os.pathsep.join([str(MACHINES[run]), env["PYTHONPATH"]])
            cache[run] = harness.run_json(env, "standins.scenario")
        return cache[run]

    return get


def routes_of(records: list[dict[str, Any]]) -> dict[str, str]:
    return {r["op"]: r["route"] for r in records if "route" in r}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_each_generation_resolves_reports_and_computes_through_its_routes(outcome, run):
    result = outcome(run)
    resolved, manifest = result["resolve"], result["manifest"]
    plan = resolved["plan"]
    profile = profiles.PROFILES[RUNS[run][0]]

    # the plan: the route of every op and why each other route was not taken
    for op, (route, rejected) in EXPECTED[run].items():
        entry = plan["routes"][op]
        assert entry["route"] == route, (op, entry)
        reasons = {r["route"]: r["reason"] for r in entry["rejected"]}
        assert set(reasons) == set(rejected), (op, reasons)
        for other, reason in rejected.items():
            assert reasons[other].startswith(reason), (op, other, reasons[other])

    # gdn.resolutions(): the op runs where the plan says, else another backend serves it
    served = {op: route or "eager" for op, (route, _) in EXPECTED[run].items() if op not in resolved["errors"]}
    assert routes_of(resolved["resolutions"]) == served

    # through those routes (the 26.6 dispatcher ops, the composite forward), outputs and gradients
    # agree with eager on the same inputs
    assert set(resolved["parity"]) == {name for name, op in (("chunk", CHUNK), ("conv", CONV)) if op in served}
    for name, errors in resolved["parity"].items():
        assert errors and max(errors.values()) < PARITY_TOL, (name, errors)

    # a loss on the final state: the route refuses the call with its reason, eager serves it (exactly
    # eager's gradients), and the record and the manifest's probe say so
    if CHUNK in served and served[CHUNK] != "eager":
        step = resolved["final_state_step"]
        assert step and set(step.values()) == {0.0}, step
        [record] = [r for r in resolved["resolutions"] if r["op"] == CHUNK]
        assert record["refusals"] == [{"reason": NO_DHT, "count": 1, "served_by": "eager"}]
        [probed] = [r for r in manifest["resolution"] if r["op"] == CHUNK]
        refused = dict(probed["probe"]["refused"])
        # the probe's case outside the head-dim limits is refused on record: no kernel sees K = 64
        outside = refused.pop("dense at K=64, V=64", "")
        assert "K = 64 is outside its limits" in outside, probed["probe"]
        assert refused == {"dense": NO_DHT, "varlen": NO_DHT}, probed["probe"]
        assert probed["probe"]["passed"] is True and "varlen_state_in.dinitial_state" in probed["probe"]["rel_err"]

    # the probe manifest names the same routes, marks the stand-ins and gives the verdicts
    assert manifest["ascendc"]["routes"] == plan["routes"]
    assert manifest["fla_npu"]["stand_in"] == profile.label == plan["surface"]["stand_in"]
    assert manifest["torch_npu"]["stand_in"] == plan["npu"]["stand_in"]
    assert manifest["fla_npu"]["distribution"]["version"] == profile.version
    verdicts = {c["name"]: c["verdict"] for c in manifest["checks"]}
    assert {name: verdicts[name] for name in CHECKS[run]} == CHECKS[run]
    # the child sees the stand-in's device and no other, whatever the machine has: where a real GPU
    # shows, every op resolves on cuda too, and the stand-in routes serve none of them there
    assert manifest["devices"]["cuda"] == {"available": False, "count": 0, "devices": []}
    assert {r["device"] for r in manifest["resolution"]} == {"cpu"}
    in_manifest = routes_of(manifest["resolution"])
    assert {op: in_manifest[op] for op in served} == served

    # one log line per decision, never one per call (the chunk op ran three times as layers)
    repeated = [line for line, n in Counter(resolved["log"]).items() if n > 1]
    assert repeated == []


def test_missing_legacy_extension_is_logged_once_and_is_no_failure(outcome):
    resolved = outcome("26.10-composite")["resolve"]
    mentions = [line for line in resolved["log"] if "FileNotFoundError" in line]
    assert len(mentions) == 1 and mentions[0].startswith("INFO gdn.ascendc: fla_npu 26.10.0 [stand-in:")
    assert resolved["plan"]["surface"]["generation"] == "26.10-stable"
    assert resolved["errors"] == {}


def test_broken_stable_conv_is_rejected_by_its_probe_and_legacy_serves(outcome):
    resolved = outcome("26.10-broken-conv-fused-fwd-1")["resolve"]
    [rejected] = resolved["plan"]["routes"][CONV]["rejected"]
    assert rejected["probe"]["passed"] is False
    assert rejected["probe"]["threshold"] == 0.15
    warnings = [line for line in resolved["log"] if line.startswith("WARNING")]
    assert warnings == [
        f"WARNING gdn.ascendc: GDN_NPU_FUSED_FWD=1 but {NO_COMPOSITE}: the decomposed forward serves",
        f"WARNING gdn.ascendc: {CONV} -> {LEGACY} ({STABLE}: {PROBE_FAILED})",
        f"WARNING gdn: {CHUNK} on cpu: ascendc refused a call ({NO_DHT}); eager serves it",
    ]


def test_strict_mode_refuses_each_degraded_op_with_its_cause(outcome):
    errors = outcome("strict")["resolve"]["errors"]
    assert set(errors) == {CHUNK, CONV}
    assert errors[CHUNK] == (
        f"GdnBackendError: gdn: {CHUNK}: backend 'ascendc': GDN_NPU_FUSED_FWD=1 but {NO_COMPOSITE}, "
        "and GDN_STRICT=1 forbids falling back"
    )
    assert errors[CONV] == (
        f"GdnBackendError: gdn: {CONV}: backend 'ascendc': {STABLE} {PROBE_FAILED}, "
        "and GDN_STRICT=1 forbids falling back"
    )
