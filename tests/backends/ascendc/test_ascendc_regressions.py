"""Cases that broke fla_npu's own kernels, from its issue tracker, through gdn in ascendc mode and
compared with the eager backend in fp32 on the same (rounded) inputs: on an Ascend runner they are the
first thing the real wheel meets; elsewhere the ascendc backend runs over the stand-in fla_npu on the
host. Values are compared after the
device has synchronised (an asynchronous device can report shapes long before it has the values), and
each case asserts which route served it: the ascendc route, or, for a call the route refuses (a loss
on the final state, a shape outside an op's limits), the next backend with the reason recorded."""

from __future__ import annotations

import pytest
import torch

import gdn
import gdn.resolve as resolver
from gdn.backends.ascendc import backend as ascendc_backend
from gdn.backends.ascendc import device as npu_device
from gdn.backends.ascendc import routes
from reference import rel_err
from standins.support import fla_npu

pytestmark = pytest.mark.shape_grid

CHUNK = "chunk_gated_delta_rule"
GRADS = ("q", "k", "v", "g", "beta", "initial_state")
# the kernels compute in bf16/fp16: rounding at their inputs and between the chained ops (see
# tests/backends/ascendc/test_ascendc_adapters.py); a wrong layout or a dropped term costs O(1)
TOL = 2e-2
DG_TOL = 4e-2  # dg is a reverse cumulative sum whose terms cancel (test_ascendc_adapters.DG_TOL)


@pytest.fixture
def npu(monkeypatch) -> torch.device:
    """The device ascendc serves: the real NPU where torch_npu finds one, else the host through the
    stand-in fla_npu (the stable API with the composite forward)."""
    found = npu_device.locate()
    before = resolver.backends().get("ascendc")
    if found.device is None or found.stand_in is not None:
        here = npu_device.Npu(torch.device("cpu"), stand_in="regression cases")
        monkeypatch.setattr(npu_device, "locate", lambda: here)
        monkeypatch.setattr(routes, "_plan", routes.resolve_plan(fla_npu(composite=True), here))
        gdn.register_backend(ascendc_backend.AscendcBackend(), replace=True)
        found = here
    monkeypatch.delenv(resolver.STRICT_ENV, raising=False)
    gdn.set_compute_mode("ascendc")
    yield found.device
    if before is not None:
        gdn.register_backend(before, replace=True)


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        getattr(torch, device.type).synchronize()


def inputs(gen, *, B=1, T, H, HV, K=128, V=128, N=None, dtype=torch.bfloat16):
    return dict(
        q=torch.randn(B, T, H, K, generator=gen).to(dtype),
        k=torch.randn(B, T, H, K, generator=gen).to(dtype),
        v=torch.randn(B, T, HV, V, generator=gen).to(dtype),
        g=-torch.rand(B, T, HV, generator=gen) * 0.5,
        beta=torch.rand(B, T, HV, generator=gen).to(dtype),
        initial_state=torch.randn(N or B, HV, K, V, generator=gen) * 0.1,
    )


def run(device, args, *, cu=None, final=False, grads=()):
    """(outputs and gradients by name on the host, after synchronising; the route that served)."""
    leaves = {n: t.to(device).requires_grad_(n in grads) for n, t in args.items()}
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    o, state = gdn.chunk_gated_delta_rule(
        **leaves, output_final_state=final, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True
    )
    route = resolver.last_route()
    named = {"o": o} | ({"final_state": state} if final else {})
    if grads:
        gen = torch.Generator().manual_seed(1)
        upstream = [torch.randn(t.shape, generator=gen).to(device) for t in named.values()]
        loss = sum((t.float() * u).sum() for t, u in zip(named.values(), upstream, strict=True))
        named |= dict(zip((f"d{n}" for n in grads), torch.autograd.grad(loss, [leaves[n] for n in grads]), strict=True))
    synchronize(device)
    return {name: t.detach().cpu() for name, t in named.items()}, route


def reference(args, **kwargs):
    with resolver.compute_mode_override("eager"):
        got, route = run(torch.device("cpu"), {n: t.float() for n, t in args.items()}, **kwargs)
    assert route == "eager"
    return got


def assert_matches(got, ref):
    assert set(got) == set(ref)
    errors = {name: rel_err(got[name], ref[name]) for name in ref}
    bad = {n: e for n, e in errors.items() if not e < (DG_TOL if n == "dg" else TOL)}
    assert not bad, errors


# name -> (inputs, how the op is called); every case needs gradients except where final=True
CASES = {
    # fla_npu #367: fwd_h with short final chunks and 1-token sequences in varlen
    "367_varlen_short_tails": (
        dict(T=3398, H=2, HV=4, N=8),
        dict(cu=[0, 2049, 3074, 3203, 3268, 3332, 3395, 3397, 3398], final=True),
    ),
    "367_one_token_sequences": (dict(T=6, H=2, HV=4, N=6), dict(cu=list(range(7)), grads=GRADS)),
    # fla_npu #351: bwd_dhu with 3 value heads per task (B = 2, Hk = 16, Hv = 32, T = 128)
    "351_bwd_dhu_grouped_heads": (dict(B=2, T=128, H=16, HV=32), dict(grads=GRADS)),
    # fla_npu #451 / #462: bwd_dv_local with HK = 15, HV = 120 at T = 1
    "451_bwd_dv_local_many_heads_one_token": (dict(T=1, H=15, HV=120), dict(grads=GRADS)),
    # fla_npu #525: recompute_w_u_fwd in fp16 (B = 2, T = 128)
    "525_recompute_w_u_fp16": (dict(B=2, T=128, H=2, HV=4, dtype=torch.float16), dict(grads=GRADS)),
    # fla_npu #149: on a v26.6.0 A2 build the first training step failed in recompute_w_u_fwd (its
    # tiling info missing from the installed OPP: "NPU out of memory ... more than 1EB"); any shape
    # meets it, so a plain training step is the case
    "149_recompute_w_u_first_training_step": (dict(T=512, H=4, HV=8), dict(grads=GRADS)),
    # fla_npu #736: chunk_gated_delta_rule_bwd short of precision on some of its generalisation cases;
    # the coverage its fused backward asked for (fla_npu #531): value heads per key head 1 to 4, tail
    # chunks, dense and packed, an initial state
    "736_bwd_three_value_heads_per_key_tail_chunk": (dict(B=2, T=200, H=2, HV=6), dict(grads=GRADS)),
    "736_bwd_four_value_heads_per_key_varlen_tails": (
        dict(T=260, H=1, HV=4, N=3),
        dict(cu=[0, 70, 200, 260], grads=GRADS),
    ),
    "736_bwd_one_value_head_per_key_varlen": (dict(T=190, H=4, HV=4, N=2), dict(cu=[0, 129, 190], grads=GRADS)),
    # empty sequences among packed ones, first and last among them
    "empty_sequences": (dict(T=100, H=2, HV=4, N=5), dict(cu=[0, 0, 40, 40, 100, 100], grads=GRADS)),
    "empty_sequences_final_state": (dict(T=100, H=2, HV=4, N=5), dict(cu=[0, 0, 40, 40, 100, 100], final=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fla_npu_regression_case_on_the_ascendc_route(npu, gen, case):
    shape, call = CASES[case]
    args = inputs(gen, **shape)
    got, route = run(npu, args, **call)
    assert route == resolver.resolve(CHUNK, npu).route and route.startswith("ascendc:")
    assert_matches(got, reference(args, **call))


def test_a_loss_on_the_final_state_is_served_by_the_next_backend_with_the_reason(npu, gen):
    # fla_npu's bwd_dhu ignores dht before fla_npu #312; on a build that has the fix, the route may take it
    args = inputs(gen, T=6, H=2, HV=4, N=6)
    call = dict(cu=list(range(7)), final=True, grads=GRADS)
    got, route = run(npu, args, **call)
    [record] = [r for r in gdn.resolutions() if r["op"] == CHUNK and r["requested_mode"] == "ascendc"]
    if record["refusals"]:
        [refused] = record["refusals"]
        assert "ignores dht" in refused["reason"] and route == refused["served_by"] == "eager"
    else:
        assert route == record["route"]
    assert_matches(got, reference(args, **call))
