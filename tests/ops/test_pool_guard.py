"""No write outside a pool, in any check mode or under CUDA-graph capture.

Every pooled op (the conv's varlen prefill with cache_indices, the conv update with
conv_state_indices, the pool decode with ssm_indices) on every backend that serves it here (eager;
triton under the interpreter; the ascendc adapters over their labelled stand-in kernels), in every
GDN_VALUE_CHECKS mode and under capture, gets slot indices past the pool, below -1 and repeated, with
its pool a view into a larger buffer whose other rows hold a sentinel. Those rows must stay as they
were, and so must every pool slot no served row names; each refused row's outputs are NaN and every
served row is computed as if the refused ones were -1 (or, where the host checks run, the call is a
ValueError naming the entry and nothing is written).

Capture is simulated on the host: the ops ask `gdn._validate._capturing` (torch's
is_current_stream_capturing), which is patched to say yes; the real thing runs on a GPU in
`test_a_captured_graph_with_bad_slots_writes_only_its_pool`. Before the fix the triton conv kernels
wrote the neighbouring rows (GDN_VALUE_CHECKS=0, and auto under capture), and eager raised a bare
IndexError for a slot past the pool and skipped one below -1 silently.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import gdn
from gdn import _validate
from gdn import resolve as resolver
from gdn.backends.base import Backend
from reference import rel_err

pytestmark = pytest.mark.single_op

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONV_FN = "causal_conv1d_fn"
CONV_UPDATE = "causal_conv1d_update"
POOL = "fused_recurrent_gated_delta_rule_update"
SENTINEL = 1234.5
BEFORE, AFTER = 2, 3  # guard rows on each side of the pool
SLOTS = 5
# (indices of four rows, the rows refused): past the pool (its first guard row after, and the last),
# below -1 (the guard row before), repeated; each with a padded row (-1) and served rows
BAD = {
    "past-the-pool": ([0, SLOTS, 2, -1], [1]),
    "far-past-the-pool": ([SLOTS + AFTER - 1, 3, 2, -1], [0]),
    "below-minus-one": ([0, -2, 2, -1], [1]),
    "repeated": ([3, 1, 3, -1], [0, 2]),
}
MODES = ("0", "auto", "1", "capture")


@dataclass
class Case:
    """One pooled call: `run(slot indices, pool)` calls the public op and returns its outputs per row."""

    op: str
    argument: str  # the name of the indices argument
    pool: torch.Tensor  # the pool's values before the call
    run: Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]

    def __call__(self, slots: list[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The call on a fresh guarded buffer (guarded): (outputs per row, the buffer after)."""
        buffer = guarded(self.pool)
        return self.run(indices(slots), pool_of(buffer)), buffer


def guarded(pool: torch.Tensor) -> torch.Tensor:
    """A buffer of BEFORE + slots + AFTER rows: the pool's values in the middle, SENTINEL around."""
    buffer = torch.full((BEFORE + pool.shape[0] + AFTER, *pool.shape[1:]), SENTINEL, dtype=pool.dtype, device=DEVICE)
    buffer[BEFORE : BEFORE + pool.shape[0]] = pool
    return buffer


def pool_of(buffer: torch.Tensor) -> torch.Tensor:
    return buffer[BEFORE:-AFTER]


def indices(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def conv_update_case(gen) -> Case:
    D, W, S = 32, 4, 5
    x = torch.randn(4, D, 2, generator=gen).to(DEVICE)
    weight, bias = torch.randn(D, W, generator=gen).to(DEVICE), torch.randn(D, generator=gen).to(DEVICE)

    def run(slots: torch.Tensor, pool: torch.Tensor):
        return list(gdn.causal_conv1d_update(x, pool, weight, bias, "silu", conv_state_indices=slots))

    return Case(CONV_UPDATE, "conv_state_indices", torch.randn(SLOTS, D, S, generator=gen).to(DEVICE), run)


def conv_fn_case(gen) -> Case:
    D, W = 32, 4
    bounds = [0, 5, 7, 19, 20]  # one sequence shorter than W - 1, one of a single token
    x = torch.randn(D, bounds[-1], generator=gen).to(DEVICE)
    weight, bias = torch.randn(D, W, generator=gen).to(DEVICE), torch.randn(D, generator=gen).to(DEVICE)
    qsl = torch.tensor(bounds, dtype=torch.int32, device=DEVICE)
    has_init = torch.tensor([True, True, False, True], device=DEVICE)

    def run(slots: torch.Tensor, pool: torch.Tensor):
        out = gdn.causal_conv1d_fn(
            x,
            weight,
            bias,
            activation="silu",
            query_start_loc=qsl,
            conv_states=pool,
            cache_indices=slots,
            has_initial_state=has_init,
        )
        return [out[:, a:b] for a, b in itertools.pairwise(bounds)]

    return Case(CONV_FN, "cache_indices", torch.randn(SLOTS, D, W - 1, generator=gen).to(DEVICE), run)


def pool_decode_case(gen, K: int = 16, V: int = 16) -> Case:
    H, HV = 1, 2
    bounds = [0, 2, 3, 3, 6]  # several tokens a sequence, one sequence without tokens
    T = bounds[-1]
    q = torch.randn(1, T, H, K, generator=gen).to(DEVICE)
    k = (torch.randn(1, T, H, K, generator=gen) * K**-0.5).to(DEVICE)
    v = torch.randn(1, T, HV, V, generator=gen).to(DEVICE)
    g = (-torch.rand(1, T, HV, generator=gen) * 0.5).to(DEVICE)
    beta = torch.rand(1, T, HV, generator=gen).to(DEVICE)
    cu = torch.tensor(bounds, dtype=torch.int32, device=DEVICE)

    def run(slots: torch.Tensor, pool: torch.Tensor):
        o = gdn.fused_recurrent_gated_delta_rule_update(
            q, k, v, g, beta, pool, slots, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
        )
        return [o[0, a:b] for a, b in itertools.pairwise(bounds)]

    return Case(POOL, "ssm_indices", (torch.randn(SLOTS, HV, K, V, generator=gen) * 0.1).to(DEVICE), run)


def ascendc_standin() -> Backend:
    """The ascendc backend's pooled ops over the stand-in kernels, on the host, with the real
    backend's value-check sets (the adapters are the real ones)."""
    from gdn.backends.ascendc import AscendcBackend
    from gdn.backends.ascendc.conv import ConvKernels, make_causal_conv1d_fn
    from gdn.backends.ascendc.recurrent import make_recurrent_ops
    from standins.support import stable

    ops = stable()
    real = AscendcBackend()
    return Backend(
        name="ascendc",
        ops={
            CONV_FN: make_causal_conv1d_fn(ConvKernels.bind(ops)),
            POOL: make_recurrent_ops(ops.get("npu_recurrent_gated_delta_rule"))[POOL],
        },
        devices=("cpu",),
        needs_probe=False,
        guards_values=real.guards_values,
        trusts_values=real.trusts_values,
        forward_only=real.forward_only,
    )


@pytest.fixture
def backend(request, monkeypatch):
    """Serves every op of the test with the backend named by the parameter, strictly (GDN_STRICT=1: a
    backend that cannot serve is an error, not a fallback to eager)."""
    name = request.param
    if name == "triton":
        pytest.importorskip("triton")
    original = resolver.backends().get("ascendc")
    if name == "ascendc":
        if DEVICE != "cpu":
            pytest.skip("the ascendc stand-ins are served on the host")
        gdn.register_backend(ascendc_standin(), replace=True)
    monkeypatch.setenv("GDN_STRICT", "1")
    gdn.set_compute_mode(name)
    yield name
    gdn.set_compute_mode(None)
    if original is not None:
        gdn.register_backend(original, replace=True)
    resolver.reset()


# the pooled ops each backend serves (fla_npu has no conv update; fla and FlashQLA serve no pooled op)
SERVED = {"eager": (CONV_FN, CONV_UPDATE, POOL), "triton": (CONV_FN, CONV_UPDATE, POOL), "ascendc": (CONV_FN, POOL)}
CASES = {CONV_FN: conv_fn_case, CONV_UPDATE: conv_update_case, POOL: pool_decode_case}


def host_checks_run(backend: str, op: str, mode: str) -> bool:
    """Whether the host checks run (and raise) for this call: GDN_VALUE_CHECKS=1 always; auto where the
    serving kernel does not check the values itself; never during capture or with 0 (every pooled op
    is safe without them)."""
    return mode == "1" or (mode == "auto" and op not in resolver.backends()[backend].guards_values)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize(
    ("backend", "op"), [(backend, op) for backend, ops in SERVED.items() for op in ops], indirect=["backend"]
)
def test_bad_slots_never_write_outside_the_pool(backend, op, bad, mode, gen, monkeypatch):
    case = pool_decode_case(gen, 128, 128) if (backend, op) == ("ascendc", POOL) else CASES[op](gen)
    given, refused = BAD[bad]
    as_padded = [-1 if row in refused else slot for row, slot in enumerate(given)]
    with torch.no_grad():
        want, want_buffer = case(as_padded)  # resolves (and probes) the backend first, as a capture needs
        assert resolver.last_route() is not None and resolver.last_route().startswith(backend)
        monkeypatch.setenv("GDN_VALUE_CHECKS", "auto" if mode == "capture" else mode)
        if mode == "capture":
            monkeypatch.setattr(_validate, "_capturing", lambda: True)
        if host_checks_run(backend, op, mode):
            buffer = guarded(case.pool)
            with pytest.raises(ValueError, match=f"argument '{case.argument}' expected"):
                case.run(indices(given), pool_of(buffer))
            assert torch.equal(buffer, guarded(case.pool))
            return
        got, buffer = case(given)
    assert_only_the_pool_changed(buffer, want_buffer, got, want, refused)


def assert_only_the_pool_changed(buffer, want_buffer, got, want, refused) -> None:
    """The guard rows hold the sentinel; every slot is what the call without the refused rows left
    (those rows neither read nor wrote theirs); refused rows NaN, served rows as without them."""
    outside = torch.cat([buffer[:BEFORE], buffer[-AFTER:]])
    assert torch.equal(outside, torch.full_like(outside, SENTINEL)), "a row outside the pool was written"
    assert not pool_of(buffer).isnan().any()
    assert rel_err(pool_of(buffer), pool_of(want_buffer)) <= 1e-5
    for row, (out, ref) in enumerate(zip(got, want, strict=True)):
        if row in refused:
            assert out.isnan().all(), f"refused row {row} is not NaN"
        elif out.numel():
            assert rel_err(out, ref) <= 1e-5, f"served row {row}"


def test_capture_is_what_torch_says_of_the_current_stream(monkeypatch):
    """The simulation above patches the function the ops ask; this holds that it asks torch."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert _validate._capturing()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert not _validate._capturing()


# ---------------------------------------------------------------------------------------------------
# offsets, and the kernels that trust the values


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["eager", "triton", "ascendc"], indirect=True)
def test_offsets_out_of_order_write_no_state_and_give_nan(backend, mode, gen, monkeypatch):
    """query_start_loc out of order (sequences would overlap) reaching the conv without the host
    checks: every output NaN, nothing read or written outside the pool, no slot written."""
    D, W = 32, 4
    x = torch.randn(D, 20, generator=gen).to(DEVICE)
    weight = torch.randn(D, W, generator=gen).to(DEVICE)
    pool = torch.randn(SLOTS, D, W - 1, generator=gen).to(DEVICE)

    def run(bounds: list[int]):
        buffer = guarded(pool)
        out = gdn.causal_conv1d_fn(
            x,
            weight,
            None,
            query_start_loc=torch.tensor(bounds, dtype=torch.int32, device=DEVICE),
            conv_states=pool_of(buffer),
            cache_indices=indices([4, 0, 2]),
            has_initial_state=torch.tensor([True, True, True], device=DEVICE),
        )
        return out, buffer

    with torch.no_grad():
        run([0, 5, 9, 20])
        monkeypatch.setenv("GDN_VALUE_CHECKS", "auto" if mode == "capture" else mode)
        if mode == "capture":
            monkeypatch.setattr(_validate, "_capturing", lambda: True)
        if host_checks_run(backend, CONV_FN, mode):
            with pytest.raises(ValueError, match="argument 'query_start_loc' expected non-decreasing offsets"):
                run([0, 12, 9, 20])
            return
        out, buffer = run([0, 12, 9, 20])
    assert out.isnan().all()
    assert torch.equal(buffer, guarded(pool))


BAD_OFFSETS = pytest.mark.parametrize(
    "bounds", [[0, 90, 20, 100], [0, 50, 100, 90]], ids=["decreasing", "past-the-tokens"]
)


def chunk_inputs(gen):
    T, H, K, V = 100, 1, 8, 8
    q, k = torch.randn(1, T, H, K, generator=gen).to(DEVICE), torch.randn(1, T, H, K, generator=gen).to(DEVICE)
    v = torch.randn(1, T, H, V, generator=gen).to(DEVICE)
    g, beta = (-torch.rand(1, T, H, generator=gen)).to(DEVICE), torch.rand(1, T, H, generator=gen).to(DEVICE)
    return q, k, v, g, beta


@BAD_OFFSETS
@pytest.mark.parametrize("backend", ["eager"], indirect=True)
def test_a_kernel_that_trusts_the_offsets_keeps_its_host_check_in_every_mode(backend, bounds, gen, monkeypatch):
    """The chunk op hands cu_seqlens to code that plans by them unchecked (eager's block plan):
    GDN_VALUE_CHECKS=0 still runs its host check. During capture, where no host check can run, the call
    is refused."""
    q, k, v, g, beta = chunk_inputs(gen)
    cu = torch.tensor(bounds, dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 40, 100], device=DEVICE))
        monkeypatch.setenv("GDN_VALUE_CHECKS", "0")
        with pytest.raises(ValueError, match="argument 'cu_seqlens' expected"):
            gdn.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
        monkeypatch.setattr(_validate, "_capturing", lambda: True)
        with pytest.raises(RuntimeError, match=f"chunk_gated_delta_rule on backend '{backend}'.*captured"):
            gdn.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)


@BAD_OFFSETS
@pytest.mark.parametrize("mode", ["0", "capture"])
@pytest.mark.parametrize("backend", ["triton"], indirect=True)
def test_the_triton_chunk_op_guards_its_offsets_on_the_device(backend, bounds, mode, gen, monkeypatch):
    """The triton chunk op plans a packed batch on the device and checks cu_seqlens there (before, it
    indexed by tables planned from them on the host: offsets past the tokens read out of range, a
    segmentation fault). With GDN_VALUE_CHECKS=0 and during capture, where no host check runs, bad
    offsets give an output and a final state of NaN, and nothing raises."""
    q, k, v, g, beta = chunk_inputs(gen)
    cu = torch.tensor(bounds, dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 40, 100], device=DEVICE))
        monkeypatch.setenv("GDN_VALUE_CHECKS", "auto" if mode == "capture" else mode)
        if mode == "capture":
            monkeypatch.setattr(_validate, "_capturing", lambda: True)
        o, final = gdn.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    assert o.isnan().all() and final.isnan().all()


# ---------------------------------------------------------------------------------------------------
# a real capture


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("op", [CONV_FN, CONV_UPDATE, POOL])
def test_a_captured_graph_with_bad_slots_writes_only_its_pool(op, gen):
    """Each pooled op on triton captured in a CUDA graph with valid slots, then replayed with slots
    past the pool, below -1 and repeated copied into the captured index tensor: the guard rows keep
    their sentinel, the refused rows come out NaN, the served rows as without the refused ones."""
    pytest.importorskip("triton")
    case = CASES[op](gen)
    with gdn.resolve.compute_mode_override("triton"), torch.no_grad():
        slots = indices([0, 1, 2, -1])
        buffer = guarded(case.pool)
        side = torch.cuda.Stream()  # the first call resolves, probes and compiles: not in a capture
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            case.run(slots, pool_of(buffer.clone()))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = case.run(slots, pool_of(buffer))
        assert resolver.last_route().startswith("triton")
        for given, refused in BAD.values():
            want, want_buffer = case([-1 if row in refused else slot for row, slot in enumerate(given)])
            buffer.copy_(guarded(case.pool))
            slots.copy_(indices(given))
            graph.replay()
            torch.cuda.synchronize()
            assert_only_the_pool_changed(buffer, want_buffer, got, want, refused)
