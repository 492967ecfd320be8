"""Route resolution of the ascendc backend, in process: each fla_npu surface (which API generation,
legacy extension or not, composite forward or not, a broken stable conv) and each GDN_NPU_FUSED_FWD
setting gives the route this module names, with the reason every other route was not taken, and
GDN_STRICT=1 refuses exactly the op whose decision degraded. The surfaces are built by hand over the
stand-in kernels; tests/backends/ascendc/test_ascendc_generations.py loads the stand-in packages themselves."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

import gdn
import gdn.calls
import gdn.resolve as resolver
from gdn.backends.ascendc import backend as ascendc_backend
from gdn.backends.ascendc import device as npu_device
from gdn.backends.ascendc import knobs, routes, surface
from gdn.backends.ascendc.backend import AscendcBackend
from standins.support import fla_npu

pytestmark = pytest.mark.probe

CPU_NPU = npu_device.Npu(torch.device("cpu"), stand_in="routes test")
CHUNK, CONV = routes.CHUNK_OP, routes.CONV_OP
RECURRENT = "fused_recurrent_gated_delta_rule"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (knobs.FUSED_FWD_ENV, resolver.STRICT_ENV, resolver.MODE_ENV):
        monkeypatch.delenv(name, raising=False)


def reasons(entry: routes.OpRoute) -> dict[str, str]:
    return {r.route: r.reason for r in entry.rejected}


def test_composite_forward_is_chosen_where_shipped():
    plan = routes.resolve_plan(fla_npu(composite=True), CPU_NPU)
    chunk = plan.ops[CHUNK]
    assert chunk.route == "ascendc:composite-fwd"
    assert chunk.detail == (
        "fla_npu.ops.ascendc.npu_chunk_gated_delta_rule_fwd forward + decomposed backward on the stable-api ops"
    )
    assert reasons(chunk) == {"ascendc:legacy-torch-ops": "also available; ascendc:composite-fwd is preferred"}
    assert chunk.strict_error is None
    assert plan.fused_fwd == "unset (composite where shipped)"


def test_fused_fwd_0_runs_the_decomposed_forward(monkeypatch):
    monkeypatch.setenv(knobs.FUSED_FWD_ENV, "0")
    chunk = routes.resolve_plan(fla_npu(composite=True), CPU_NPU).ops[CHUNK]
    assert chunk.route == "ascendc:stable-api"
    assert reasons(chunk)["ascendc:composite-fwd"] == "disabled by GDN_NPU_FUSED_FWD=0"
    assert chunk.strict_error is None


def test_fused_fwd_1_without_the_composite_degrades_with_a_warning(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="gdn")
    monkeypatch.setenv(knobs.FUSED_FWD_ENV, "1")
    chunk = routes.resolve_plan(fla_npu(), CPU_NPU).ops[CHUNK]
    assert chunk.route == "ascendc:stable-api"
    assert chunk.strict_error == "GDN_NPU_FUSED_FWD=1 but fla_npu.ops.ascendc has no npu_chunk_gated_delta_rule_fwd"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "gdn.ascendc: GDN_NPU_FUSED_FWD=1 but fla_npu.ops.ascendc has no npu_chunk_gated_delta_rule_fwd: "
        "the decomposed forward serves"
    ]


def test_default_without_the_composite_is_not_a_strict_error():
    chunk = routes.resolve_plan(fla_npu(legacy=False), CPU_NPU).ops[CHUNK]
    assert chunk.route == "ascendc:stable-api"
    assert chunk.strict_error is None


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_fused_fwd_accepts_only_0_and_1(monkeypatch, value):
    monkeypatch.setenv(knobs.FUSED_FWD_ENV, value)
    with pytest.raises(ValueError, match=f"GDN_NPU_FUSED_FWD: expected 0 or 1.*got '{value}'"):
        routes.resolve_plan(fla_npu(), CPU_NPU)


def test_broken_stable_conv_falls_back_to_the_legacy_route():
    conv = routes.resolve_plan(fla_npu(broken_conv=True), CPU_NPU).ops[CONV]
    assert conv.route == "ascendc:legacy-torch-ops"
    assert conv.detail == "torch.ops.npu.npu_causal_conv1d"
    [rejected] = conv.rejected
    assert rejected.route == "ascendc:stable-api"
    assert rejected.reason == "numeric conv probe failed: ones.out: all zeros where the reference is not"
    assert rejected.probe["passed"] is False and rejected.probe["threshold"] == 0.15
    assert conv.strict_error == "ascendc:stable-api " + rejected.reason


def test_broken_stable_conv_without_legacy_has_no_route():
    conv = routes.resolve_plan(fla_npu(broken_conv=True, legacy=False), CPU_NPU).ops[CONV]
    assert conv.route is None and conv.fn is None
    assert conv.reason == (
        "no fla_npu route: ascendc:stable-api: numeric conv probe failed: ones.out: all zeros where the reference "
        "is not; ascendc:legacy-torch-ops: torch.ops.npu holds no fla_npu ops (legacy extension not shipped: "
        "FileNotFoundError: not find custom_aclnn_extension_lib*.so)"
    )


def test_a_26_6_surface_serves_through_torch_ops_and_has_no_decode_op():
    plan = routes.resolve_plan(fla_npu(stable=False), CPU_NPU)
    assert plan.ops[CHUNK].route == plan.ops[CONV].route == "ascendc:legacy-torch-ops"
    assert reasons(plan.ops[CHUNK]) == {
        "ascendc:stable-api": "fla_npu has no load_legacy_torch_ops(): a 26.6-style wheel",
        "ascendc:composite-fwd": (
            "npu_chunk_gated_delta_rule_fwd needs the stable API, and the legacy-torch-ops route serves"
        ),
    }
    assert plan.ops[RECURRENT].route is None
    assert reasons(plan.ops[RECURRENT])["ascendc:legacy-torch-ops"] == (
        "lacks torch.ops.npu.npu_recurrent_gated_delta_rule"
    )


def test_fla_npu_that_does_not_import_makes_the_backend_unavailable():
    found = surface.Surface(import_error="RuntimeError: CANN environment is not initialized.")
    plan = routes.resolve_plan(found, CPU_NPU)
    assert plan.unavailable == "fla_npu is not importable: RuntimeError: CANN environment is not initialized."
    assert plan.ops == {}


# ---------------------------------------------------------------------------------------------------
# the backend object in the resolver


@pytest.fixture
def backend_with(monkeypatch):
    """Register a fresh ascendc backend whose plan is resolved over a hand-built fla_npu on cpu."""
    before = resolver.backends().get("ascendc")

    def install(found: surface.Surface) -> AscendcBackend:
        monkeypatch.setattr(npu_device, "locate", lambda: CPU_NPU)
        monkeypatch.setattr(routes, "_plan", routes.resolve_plan(found, CPU_NPU))
        backend = ascendc_backend.AscendcBackend()
        gdn.register_backend(backend, replace=True)
        gdn.set_compute_mode("ascendc")
        return backend

    yield install
    if before is None:
        gdn.unregister_backend("ascendc")
    else:
        gdn.register_backend(before, replace=True)


def routes_by_op() -> dict[str, str]:
    return {r["op"]: r["route"] for r in gdn.resolutions()}


def test_strict_mode_refuses_only_the_degraded_op(backend_with, monkeypatch):
    monkeypatch.setenv(resolver.STRICT_ENV, "1")
    backend_with(fla_npu(composite=True, broken_conv=True))
    with pytest.raises(gdn.GdnBackendError) as refused:
        resolver.resolve(CONV, "cpu")
    assert str(refused.value) == (
        "gdn: causal_conv1d_fn: backend 'ascendc': ascendc:stable-api numeric conv probe failed: ones.out: all zeros "
        "where the reference is not, and GDN_STRICT=1 forbids falling back"
    )
    assert resolver.resolve(CHUNK, "cpu").route == "ascendc:composite-fwd"


def test_strict_mode_refuses_fused_fwd_1_without_the_composite(backend_with, monkeypatch):
    monkeypatch.setenv(knobs.FUSED_FWD_ENV, "1")
    monkeypatch.setenv(resolver.STRICT_ENV, "1")
    backend_with(fla_npu())
    with pytest.raises(gdn.GdnBackendError, match=r"GDN_NPU_FUSED_FWD=1 but .* has no npu_chunk_gated_delta_rule_fwd"):
        resolver.resolve(CHUNK, "cpu")
    assert resolver.resolve(CONV, "cpu").route == "ascendc:stable-api"


def test_without_strict_the_degraded_op_falls_back(backend_with):
    backend_with(fla_npu(composite=True, broken_conv=True, legacy=False))
    for op in (CHUNK, CONV, RECURRENT):
        resolver.resolve(op, "cpu")
    assert routes_by_op() == {CHUNK: "ascendc:composite-fwd", CONV: "eager", RECURRENT: "ascendc:stable-api"}
    records = {r["op"]: r for r in gdn.resolutions()}
    assert records[CONV]["rejected"][0]["backend"] == "ascendc"
    # the decode kernel has no backward: training calls of it run eager
    assert (records[RECURRENT]["forward_only"], records[CHUNK]["forward_only"]) == (True, False)


def test_why_an_op_has_no_route(backend_with):
    backend = backend_with(fla_npu(stable=False))
    assert backend.why_op_unavailable(CHUNK) is None
    assert backend.why_op_unavailable(RECURRENT).startswith("no fla_npu route: ascendc:stable-api: fla_npu has no")
    assert backend.implementation(RECURRENT) is None


# ---------------------------------------------------------------------------------------------------
# the device and the kernel dtype


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="asserts a machine without torch_npu")
def test_without_torch_npu_the_backend_says_so():
    npu = npu_device.locate()
    assert npu.device is None
    assert npu.error == "torch_npu is not importable: ModuleNotFoundError: No module named 'torch_npu'"


@pytest.mark.parametrize(("device_type", "reason"), [("cpu", None), ("npu", "runs on cpu, not npu")])
def test_the_stand_in_serves_cpu_only(device_type, reason):
    assert npu_device.why_not(device_type, CPU_NPU) == reason


def test_cpu_is_never_served_by_a_real_torch_npu():
    real = npu_device.Npu(torch.device("meta"))  # any real device: only the stand-in offers cpu
    assert npu_device.why_not("cpu", real) == (
        "serves cpu only through the stand-in torch_npu of tests/standins; this torch_npu is real"
    )


def test_fp32_runs_in_bf16_and_half_types_stay():
    assert knobs.kernel_dtype(torch.float32) == torch.bfloat16
    assert knobs.kernel_dtype(torch.float16) == torch.float16
    assert knobs.kernel_dtype(torch.bfloat16) == torch.bfloat16


def chunk_args(K: int, V: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    return dict(
        q=torch.randn(1, 40, 2, K, generator=gen),
        k=torch.randn(1, 40, 2, K, generator=gen),
        v=torch.randn(1, 40, 4, V, generator=gen),
        g=-torch.rand(1, 40, 4, generator=gen) * 0.5,
        beta=torch.rand(1, 40, 4, generator=gen),
        use_qk_l2norm_in_kernel=True,
    )


def test_a_shape_outside_the_limits_is_served_by_the_next_backend_with_the_reason(backend_with):
    backend_with(fla_npu(composite=True))
    reference = resolver.backends()["eager"].implementation(CHUNK)
    for _ in range(2):
        out, _ = gdn.chunk_gated_delta_rule(**chunk_args(64, 128))
    [record] = [r for r in gdn.resolutions() if r["op"] == CHUNK]
    assert (record["backend"], record["route"]) == ("ascendc", "ascendc:composite-fwd")
    [refused] = record["refusals"]
    assert "npu_chunk_gated_delta_rule_bwd_dhu: K = 64 is outside its limits [128]" in refused["reason"]
    assert (refused["count"], refused["served_by"]) == (2, "eager")
    call = gdn.calls.PREPARE[CHUNK](**chunk_args(64, 128))
    expected, _ = reference(call)
    torch.testing.assert_close(out, expected)
    # a shape inside the limits is the route's own
    gdn.chunk_gated_delta_rule(**chunk_args(128, 128))
    assert [r["refusals"][0]["count"] for r in gdn.resolutions() if r["op"] == CHUNK] == [2]


def test_strict_mode_raises_on_a_refused_call_with_the_reason(backend_with, monkeypatch):
    monkeypatch.setenv(resolver.STRICT_ENV, "1")
    backend_with(fla_npu())
    with pytest.raises(gdn.GdnBackendError) as refused:
        gdn.chunk_gated_delta_rule(**chunk_args(128, 96))
    assert str(refused.value).startswith(
        f"gdn: {CHUNK} on cpu: backend 'ascendc' refused the call (npu_chunk_gated_delta_rule_bwd_dhu: V = 96 "
        "is outside its limits [128, 256])"
    )
    assert str(refused.value).endswith("and GDN_STRICT=1 forbids falling back")


def conv_args(D: int, W: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    return dict(x=torch.randn(2, D, 30, generator=gen), weight=torch.randn(D, W, generator=gen), activation="silu")


def recurrent_args(K: int, V: int) -> dict:
    return {**chunk_args(K, V), "initial_state": torch.zeros(1, 4, K, V), "output_final_state": True}


@pytest.mark.parametrize(
    ("op", "args", "reason"),
    [
        (CONV, conv_args(48, 5), "npu_causal_conv1d_fn: W = 5 is outside its limits [2, 3, 4]"),
        (CONV, conv_args(40, 4), "npu_causal_conv1d_fn: D = 40 must be a multiple of 16"),
        (RECURRENT, recurrent_args(64, 128), "npu_recurrent_gated_delta_rule: DK = 64 is outside its limits [128]"),
        (RECURRENT, recurrent_args(128, 256), "npu_recurrent_gated_delta_rule: DV = 256 is outside its limits [128]"),
    ],
)
def test_conv_and_recurrent_calls_outside_the_op_limits_are_served_by_eager(backend_with, op, args, reason):
    backend_with(fla_npu())
    out = getattr(gdn, op)(**args)
    call = gdn.calls.PREPARE[op](**args)
    expected = resolver.backends()["eager"].implementation(op)(call)
    torch.testing.assert_close(out, expected)
    [record] = [r for r in gdn.resolutions() if r["op"] == op]
    assert record["backend"] == "ascendc"
    [refused] = record["refusals"]
    assert reason in refused["reason"] and (refused["count"], refused["served_by"]) == (1, "eager")
