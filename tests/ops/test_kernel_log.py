"""gdn's kernel log: what each op call really ran, at gdn's level (the backend and route per call, with
the backends that passed it on) and inside a peer (fla's registry, per function and per dtype).

fla's registry needs fla, so its cases run in subprocesses that put the labelled STAND-INS of
tests/peer_standins on sys.path: fla 0.6.0's registry rules and dispatch loop on a simulated H200, whose
chunk op's backward hands dg to a dispatched `common.chunk_bwd_dqkwg`, and tilelang (which makes fla's
TileLang backend available: the stand-in's kernel is a wrong one, dg 20% too large).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import gdn
import gdn.resolve as resolver
from gdn import kernel_log
from gdn.backends.base import Backend
from gdn.backends.eager import EAGER
from gdn.kernel_log import KernelEntry, KernelLog
from gdn.matrix.kernels import kernel_records, recording
from repo_paths import SRC, TESTS

pytestmark = pytest.mark.single_op

STANDINS = TESTS / "peer_standins"
OP = "chunk_gated_delta_rule"


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    monkeypatch.delenv(resolver.MODE_ENV, raising=False)
    gdn.set_compute_mode(None)
    resolver.reset()
    # In a cell, the kernels plugin keeps its log in force for the whole session; these tests put logs
    # in force themselves, so the cell's is set aside while each runs.
    cells_log = kernel_log.install(None)
    yield
    kernel_log.install(cells_log)
    if "fp32-refuser" in resolver.backends():
        gdn.unregister_backend("fp32-refuser")
    gdn.set_compute_mode(None)
    resolver.reset()


def chunk_inputs(dtype: torch.dtype, gen: torch.Generator, *, T: int = 20, D: int = 16) -> tuple:
    q = torch.randn(1, T, 2, D, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(1, T, 2, D, generator=gen).to(dtype).requires_grad_()
    v = torch.randn(1, T, 4, D, generator=gen).to(dtype).requires_grad_()
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, 4, generator=gen)).requires_grad_()
    beta = torch.rand(1, T, 4, generator=gen).to(dtype).requires_grad_()
    return q, k, v, g, beta


def test_nothing_is_noted_while_no_log_is_in_force():
    assert kernel_log.ACTIVE is None
    gdn.chunk_gated_delta_rule(*chunk_inputs(torch.float32, torch.Generator().manual_seed(0)))
    log = KernelLog()
    assert log.mark() == {}


def test_each_call_notes_its_route_dtype_and_the_backend_that_refused_it():
    """A backend that refuses fp32 calls: its bf16 calls are its own, its fp32 calls eager's, and the
    log says which backend passed them on and why."""

    class Fp32Refuser(Backend):
        def refusal(self, op, call):
            return "takes half precision only" if call.q.dtype == torch.float32 else None

    refuser = Fp32Refuser(name="fp32-refuser", ops={OP: EAGER.ops[OP]}, devices=("cpu",), needs_probe=False)
    gdn.register_backend(refuser)
    gen = torch.Generator().manual_seed(1)
    with resolver.compute_mode_override("fp32-refuser"), recording() as log:
        for dtype in (torch.bfloat16, torch.float32, torch.float32):
            gdn.chunk_gated_delta_rule(*chunk_inputs(dtype, gen))
    counts = log.mark()
    assert counts == {
        KernelEntry("gdn", OP, "bfloat16", "fp32-refuser"): 1,
        KernelEntry("gdn", OP, "float32", "eager", (("fp32-refuser", "takes half precision only"),)): 2,
    }


def test_marks_give_what_a_span_ran():
    gen = torch.Generator().manual_seed(2)
    with recording() as log:
        gdn.chunk_gated_delta_rule(*chunk_inputs(torch.float32, gen))
        mark = log.mark()
        gdn.l2norm(torch.randn(3, 8, generator=gen))
        gdn.l2norm(torch.randn(3, 8, generator=gen))
    assert log.since(mark) == {KernelEntry("gdn", "l2norm", "float32", "eager"): 2}
    assert kernel_log.ACTIVE is None


def test_a_call_the_value_checks_refuse_is_not_recorded_as_run():
    """A call whose cu_seqlens the host value checks refuse never reaches a kernel: the thread's latest
    route stays the previous call's and the log in force counts nothing for it."""
    routed = Backend(
        name="routed",
        ops={"l2norm": EAGER.ops["l2norm"]},
        devices=("cpu",),
        needs_probe=False,
        route=lambda op: "routed",
    )
    gdn.register_backend(routed)
    gen = torch.Generator().manual_seed(3)
    q, k, v, g, beta = (t.detach() for t in chunk_inputs(torch.float32, gen, T=5))
    decreasing = torch.tensor([0, 4, 2, 5], dtype=torch.int64)
    try:
        with recording() as log:
            with resolver.compute_mode_override("routed"):
                gdn.l2norm(torch.randn(3, 8, generator=gen))
            mark = log.mark()
            with pytest.raises(ValueError, match="non-decreasing"):
                gdn.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=decreasing)
            refused = log.since(mark)
        assert kernel_log.last_route() == "routed"
        assert refused == {}
    finally:
        gdn.unregister_backend("routed")


def run_with_standins(code: str, *sites: str, **env: str) -> dict:
    """Run `code` (which prints one JSON value) with the stand-in sites and gdn on sys.path."""
    path = os.pathsep.join([*(str(STANDINS / site) for site in sites), str(SRC)])
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLA_", "GDN_"))}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**clean, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


# the fla adapter widened to the host, one fp32 and one bf16 forward+backward through fla, the log printed
THROUGH_FLA = """
    import dataclasses, json, torch, gdn
    import gdn.backends.fla as fla_backend
    from gdn.backends.eager import EAGER
    from gdn.calls import PREPARE
    from gdn.matrix.kernels import kernel_records, recording

    fla = fla_backend.FlaBackend()
    gdn.register_backend(dataclasses.replace(fla, devices=("cpu",), auto_rank={"cpu": 0}), replace=True)
    gen = torch.Generator().manual_seed(3)
    results = {}
    with recording() as log:
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(1, 70, h, 128, generator=gen).to(dtype).requires_grad_() for h in (2, 2, 4))
            g = torch.nn.functional.logsigmoid(torch.randn(1, 70, 4, generator=gen)).requires_grad_()
            beta = torch.rand(1, 70, 4, generator=gen).to(dtype).requires_grad_()
            call = PREPARE["chunk_gated_delta_rule"](q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
            for name, backend in (("fla", fla), ("eager", EAGER)):
                o, _ = backend.implementation("chunk_gated_delta_rule")(call)
                grads = torch.autograd.grad(o.float().sum(), (q, k, v, g, beta))
                results[f"{name}-{dtype}"] = [t.float().sum().item() for t in (o, *grads)]
    print(json.dumps({"kernels": kernel_records(log.mark()), "results": results}))
"""


def peer_lines(records: list[dict]) -> set[tuple]:
    return {
        (r["function"], r["dtype"], r["ran"], tuple((p["backend"], p["reason"]) for p in r["passed_over"]))
        for r in records
        if r["level"] == "fla"
    }


def test_flas_dispatch_is_followed_per_function_and_dtype():
    """With FlashQLA and tilelang installed: a bf16 chunk call goes to FlashQLA; an fp32 one is refused by
    FlashQLA's verifier and runs fla's own function, whose backward's chunk_bwd_dqkwg goes to TileLang.
    One static answer (bf16) would have named FlashQLA for both."""
    found = run_with_standins(THROUGH_FLA, "fla_registry", "flashqla_site")
    fp32_refusal = ("flash_qla", "FlashQLA requires dtype float16 or bfloat16, got torch.float32")
    assert peer_lines(found["kernels"]) == {
        ("gated_delta_rule.chunk_gated_delta_rule", "float32", "triton", (fp32_refusal,)),
        ("common.chunk_bwd_dqkwg", "float32", "tilelang", ()),
        ("gated_delta_rule.chunk_gated_delta_rule", "bfloat16", "flash_qla", ()),
    }


def test_without_tilelang_dqkwg_runs_flas_own_function():
    found = run_with_standins(THROUGH_FLA, "fla_registry")
    lines = peer_lines(found["kernels"])
    assert ("common.chunk_bwd_dqkwg", "float32", "triton", ()) in lines
    assert not any(ran == "tilelang" for _, _, ran, _ in lines)


def test_watching_changes_nothing_fla_computes():
    watched = run_with_standins(THROUGH_FLA, "fla_registry", "flashqla_site")["results"]
    unwatched = run_with_standins(
        THROUGH_FLA.replace("with recording() as log:", "if True:").replace("kernel_records(log.mark())", "[]"),
        "fla_registry",
        "flashqla_site",
    )["results"]
    assert watched == unwatched
    # the stand-in TileLang kernel is wrong (dg 20% too large): the fp32 call's dg shows it, the bf16 one's not
    assert watched["fla-torch.float32"][4] == pytest.approx(1.2 * watched["eager-torch.float32"][4], rel=1e-4)


def test_watching_puts_flas_method_back():
    code = """
        import json
        import fla.backends
        from gdn.backends.fla_dispatch import watching

        method = fla.backends.BackendRegistry._get_sorted_backends
        with watching() as found:
            inside = fla.backends.BackendRegistry._get_sorted_backends is method
        print(json.dumps([found, inside, fla.backends.BackendRegistry._get_sorted_backends is method]))
    """
    assert run_with_standins(code, "fla_registry") == [True, False, True]


def test_a_missing_fla_is_not_watched():
    code = """
        import json
        from gdn.backends.fla_dispatch import watching
        with watching() as found:
            print(json.dumps(found))
    """
    assert run_with_standins(code) is False


def test_records_round_trip_through_json():
    counts = {KernelEntry("fla", "common.chunk_bwd_dqkwg", "float32", "tilelang", (("x", "why"),), "probe"): 3}
    from gdn.matrix.kernels import entries

    assert entries(json.loads(json.dumps(kernel_records(counts)))) == counts


def test_flashqlas_architecture_and_split_are_noted_per_forward_call():
    code = """
        import dataclasses, json, torch, gdn
        import gdn.backends.flashqla as flashqla_backend
        from gdn.matrix.kernels import kernel_records, recording

        backend = dataclasses.replace(flashqla_backend.FlashQLABackend(), devices=("cpu",), auto_rank={"cpu": 0})
        gen = torch.Generator().manual_seed(4)
        with recording() as log:
            for B in (1, 2):
                q, k = (torch.randn(B, 70, 2, 128, generator=gen).bfloat16() for _ in range(2))
                v = torch.randn(B, 70, 4, 128, generator=gen).bfloat16()
                g, beta = -torch.rand(B, 70, 4, generator=gen), torch.rand(B, 70, 4, generator=gen).bfloat16()
                call = gdn.calls.PREPARE["chunk_gated_delta_rule"](q, k, v, g, beta)
                backend.implementation("chunk_gated_delta_rule")(call)
        print(json.dumps(kernel_records(log.mark())))
    """
    found = run_with_standins(code, "flashqla_site")
    ran = {(r["level"], r["function"], r["dtype"], r["ran"], r["calls"]) for r in found}
    assert ran == {
        ("flash_qla", "chunk_gated_delta_rule", "bfloat16", "hopper, intra-card CP", 1),
        ("flash_qla", "chunk_gated_delta_rule", "bfloat16", "hopper", 1),
    }
