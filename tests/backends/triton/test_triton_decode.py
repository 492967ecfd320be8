"""The triton backend's fused recurrent kernels (plain and state-pool decode) against the eager
backend, decode steps against the eager chunk op, and what the GPU compiler makes of them.

Without a CUDA device the kernels run under the Triton interpreter (TRITON_INTERPRET=1), which
Triton reads when a kernel is decorated: it is set here before the kernel modules are imported.
The sm_90 compile harness it shares with the other kernel tests is tests/triton_harness.py.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

import gdn
from gdn import _validate
from gdn.backends.eager import EAGER
from gdn.backends.triton import decode
from gdn.resolve import compute_mode_override
from reference import rel_err
from triton_harness import DEVICE, TOL, run, run_on_hopper_compiler

PLAIN = "fused_recurrent_gated_delta_rule"
POOL = "fused_recurrent_gated_delta_rule_update"
# How a one-token program walks its V slices: the heuristic's choice for these small shapes, and forced
# walks of several 8-column slices through a pipeline (V = 20: the third slice of a head half past V),
# over the two value heads of a q/k head: in pairs (one pair straddles the heads) or all six at once.
WALKS = [{}, {"BV": 8, "SLICES": 2, "STAGES": 2}, {"BV": 8, "SLICES": 6, "STAGES": 3}]
WALK_IDS = ["heuristic", "2-slice-walks", "6-slice-walk"]


def triton_and_eager(op: str, *args, **kwargs):
    return run(getattr(decode, op), op, *args, **kwargs), run(EAGER.ops[op], op, *args, **kwargs)


def make_inputs(gen, B, T, H, HV, K, V, dtype=torch.float32):
    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)

    q, k, v = randn(B, T, H, K), randn(B, T, H, K, scale=K**-0.5), randn(B, T, HV, V)
    g = (-torch.rand(B, T, HV, generator=gen) * 0.5).to(DEVICE)  # fp32, as Qwen3.5 computes it
    beta = torch.rand(B, T, HV, generator=gen).to(DEVICE, dtype)
    return q, k, v, g, beta


def random_pool(gen, slots, HV, K, V):
    return (torch.randn(slots, HV, K, V, generator=gen) * 0.1).to(DEVICE)


# ---------------------------------------------------------------------------------------------------
# against eager


@pytest.mark.shape_grid
@pytest.mark.parametrize(
    ("dtype", "B", "T", "H", "HV", "K", "V", "with_state", "l2norm", "scale"),
    [
        (torch.float32, 2, 5, 1, 2, 24, 40, True, True, None),  # GVA, K and V not powers of two
        (torch.float32, 3, 1, 2, 4, 16, 16, False, False, 0.3),
        (torch.float32, 1, 3, 2, 2, 100, 60, True, False, None),  # V over several slices
        (torch.bfloat16, 2, 4, 2, 4, 32, 24, True, True, None),
    ],
)
def test_plain_matches_eager(dtype, B, T, H, HV, K, V, with_state, l2norm, scale, gen):
    q, k, v, g, beta = make_inputs(gen, B, T, H, HV, K, V, dtype)
    h0 = random_pool(gen, B, HV, K, V) if with_state else None
    kwargs = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=l2norm, scale=scale)
    (o, final), (ro, rfinal) = triton_and_eager(PLAIN, q, k, v, g, beta=beta, **kwargs)
    assert o.dtype == v.dtype and final.dtype == torch.float32
    assert rel_err(o, ro) <= TOL[dtype]
    assert rel_err(final, rfinal) <= 1e-5


@pytest.mark.single_op
@pytest.mark.parametrize("walk", WALKS, ids=WALK_IDS)
def test_one_token_walks_match_eager(walk, gen, monkeypatch):
    """One token per sequence, with and without states, through each walk over the V slices."""
    monkeypatch.setattr(decode, "OVERRIDES", dict(walk))
    q, k, v, g, beta = make_inputs(gen, 3, 1, 2, 4, 16, 20)
    h0 = random_pool(gen, 3, 4, 16, 20)
    for kwargs in ({}, {"initial_state": h0, "output_final_state": True}):
        (o, final), (ro, rfinal) = triton_and_eager(
            PLAIN, q, k, v, g, beta=beta, use_qk_l2norm_in_kernel=True, **kwargs
        )
        assert rel_err(o, ro) <= 1e-5
        assert (final is None) is (rfinal is None) and (final is None or rel_err(final, rfinal) <= 1e-5)


@pytest.mark.single_op
def test_plain_varlen_and_no_final_state(gen):
    bounds = [0, 3, 3, 7, 8]  # with an empty sequence: its final state is its initial state
    q, k, v, g, beta = make_inputs(gen, 1, 8, 1, 2, 16, 16)
    h0 = random_pool(gen, 4, 2, 16, 16)
    cu = torch.tensor(bounds, device=DEVICE)
    (o, final), (ro, rfinal) = triton_and_eager(
        PLAIN,
        q,
        k,
        v,
        g,
        beta=beta,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
    )
    assert rel_err(o, ro) <= 1e-5 and rel_err(final, rfinal) <= 1e-5
    assert torch.equal(final[1], h0[1])
    o_only, none = run(
        decode.fused_recurrent_gated_delta_rule,
        PLAIN,
        q,
        k,
        v,
        g,
        beta=beta,
        initial_state=h0,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
    )
    assert none is None and torch.equal(o_only, o)


@pytest.mark.single_op
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_pool_matches_eager_and_padding_leaves_rows_bit_identical(dtype, gen):
    B, H, HV, K, V, slots = 4, 2, 4, 16, 20, 7
    q, k, v, g, beta = make_inputs(gen, B, 1, H, HV, K, V, dtype)
    pool = random_pool(gen, slots, HV, K, V)
    before, eager_pool = pool.clone(), pool.clone()
    indices = torch.tensor([4, -1, 0, 2], dtype=torch.int32, device=DEVICE)
    o = run(decode.fused_recurrent_gated_delta_rule_update, POOL, q, k, v, g, beta, pool, indices)
    ro = run(EAGER.ops[POOL], POOL, q, k, v, g, beta, eager_pool, indices)
    assert rel_err(o, ro) <= TOL[dtype]
    assert rel_err(pool, eager_pool) <= 1e-5
    assert torch.equal(o[1], torch.zeros_like(o[1]))
    untouched = [1, 3, 5, 6]
    assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.single_op
@pytest.mark.parametrize("walk", WALKS, ids=WALK_IDS)
@pytest.mark.parametrize("pool_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_pools_round_the_fp32_recurrence_into_the_pool(pool_dtype, walk, gen, monkeypatch):
    """A bf16 / fp16 pool: the state is read from the pool's dtype, the step runs in fp32 and the new
    state is rounded into the pool (half the state traffic of an fp32 pool), as eager does."""
    monkeypatch.setattr(decode, "OVERRIDES", dict(walk))
    B, H, HV, K, V, slots = 4, 2, 4, 16, 20, 7
    q, k, v, g, beta = make_inputs(gen, B, 1, H, HV, K, V, torch.bfloat16)
    pool = random_pool(gen, slots, HV, K, V).to(pool_dtype)
    before, eager_pool = pool.clone(), pool.clone()
    indices = torch.tensor([4, -1, 0, 2], dtype=torch.int32, device=DEVICE)
    o = run(decode.fused_recurrent_gated_delta_rule_update, POOL, q, k, v, g, beta, pool, indices)
    ro = run(EAGER.ops[POOL], POOL, q, k, v, g, beta, eager_pool, indices)
    assert pool.dtype == pool_dtype
    assert rel_err(o, ro) <= TOL[torch.bfloat16]
    # both round the same fp32 state into the pool's dtype: they differ by at most an ulp here and there
    assert rel_err(pool.float(), eager_pool.float()) <= 4e-3
    assert not torch.equal(pool[[4, 0, 2]], before[[4, 0, 2]])
    assert torch.equal(pool[[1, 3, 5, 6]], before[[1, 3, 5, 6]])


@pytest.mark.single_op
def test_pool_varlen_multi_token(gen):
    bounds = [0, 3, 3, 4, 6, 7]  # a live sequence with no tokens, a padded one, several tokens each
    q, k, v, g, beta = make_inputs(gen, 1, 7, 1, 2, 8, 8)
    pool = random_pool(gen, 6, 2, 8, 8)
    before, eager_pool = pool.clone(), pool.clone()
    indices = torch.tensor([1, 5, -1, 3, 0], device=DEVICE)
    kwargs = dict(cu_seqlens=torch.tensor(bounds, device=DEVICE), use_qk_l2norm_in_kernel=True)
    o = run(decode.fused_recurrent_gated_delta_rule_update, POOL, q, k, v, g, beta, pool, indices, **kwargs)
    ro = run(EAGER.ops[POOL], POOL, q, k, v, g, beta, eager_pool, indices, **kwargs)
    assert rel_err(o, ro) <= 1e-5 and rel_err(pool, eager_pool) <= 1e-5
    assert torch.equal(o[:, 3:4], torch.zeros_like(o[:, 3:4]))
    assert torch.equal(pool[[2, 4, 5]], before[[2, 4, 5]])  # unnamed, and the live slot without tokens


@pytest.mark.single_op
@pytest.mark.parametrize("walk", WALKS, ids=WALK_IDS)
@pytest.mark.parametrize(
    ("indices", "refused"),
    [([4, 7, 0, 2], [1]), ([4, -2, 0, 2], [1]), ([2, -1, 0, 2], [0, 3]), ([6, -1, 3, 0], [])],
    ids=["past-the-pool", "below-minus-one", "repeated", "valid"],
)
def test_pool_slots_out_of_range_or_repeated_give_nan_rows_and_leave_the_pool(indices, refused, walk, gen, monkeypatch):
    """The kernel reads the slots on the device: a bad one never reaches memory out of range and
    never writes a slot; its sequence's outputs are NaN, every other sequence is served as usual."""
    monkeypatch.setattr(decode, "OVERRIDES", dict(walk))
    B, H, HV, K, V, slots = 4, 2, 4, 16, 20, 7
    q, k, v, g, beta = make_inputs(gen, B, 1, H, HV, K, V)
    pool = random_pool(gen, slots, HV, K, V)
    before, eager_pool = pool.clone(), pool.clone()
    idx = torch.tensor(indices, dtype=torch.int32, device=DEVICE)
    o = run(decode.fused_recurrent_gated_delta_rule_update, POOL, q, k, v, g, beta, pool, idx)
    served = [n for n in range(B) if n not in refused]
    assert o[refused].isnan().all()
    assert not o[served].isnan().any()
    # eager, given only the served sequences, computes what the kernel gave them
    served_idx = idx[served]
    ro = run(EAGER.ops[POOL], POOL, *(x[served] for x in (q, k, v, g, beta)), eager_pool, served_idx)
    assert rel_err(o[served], ro) <= 1e-5
    written = sorted({indices[n] for n in served if indices[n] >= 0})
    kept = [s for s in range(slots) if s not in written]
    assert torch.equal(pool[kept], before[kept])
    assert rel_err(pool[written], eager_pool[written]) <= 1e-5


@pytest.mark.single_op
@pytest.mark.parametrize(
    ("bounds", "refused"),
    [([0, 3, 2, 7], [0, 1, 2]), ([0, 3, 9, 7], [0, 1, 2]), ([0, 3, 5, 7], []), ([1, 3, 5, 6], [])],
    ids=["decreasing", "past-the-tokens", "valid", "uncovered-tokens"],
)
def test_cu_seqlens_out_of_order_give_nan_and_no_state_traffic(bounds, refused, gen):
    """Offsets read on the device: offsets out of order or past the tokens (sequences would overlap)
    give every sequence no tokens, NaN outputs and final states, and keep the pool; tokens that no
    sequence covers are NaN rows."""
    q, k, v, g, beta = make_inputs(gen, 1, 7, 1, 2, 8, 8)
    cu = torch.tensor(bounds, device=DEVICE)
    h0 = random_pool(gen, 3, 2, 8, 8)
    o, final = run(
        decode.fused_recurrent_gated_delta_rule, PLAIN, q, k, v, g, beta=beta, initial_state=h0,
        output_final_state=True, cu_seqlens=cu,
    )  # fmt: skip
    served = [n for n in range(3) if n not in refused]
    assert final[refused].isnan().all() and not final[served].isnan().any()
    covered = {t for n in served for t in range(bounds[n], bounds[n + 1])}
    for t in range(7):
        assert bool(o[0, t].isnan().all()) is (t not in covered), t
    pool = random_pool(gen, 4, 2, 8, 8)
    before = pool.clone()
    idx = torch.tensor([3, 0, 1], device=DEVICE)
    run(decode.fused_recurrent_gated_delta_rule_update, POOL, q, k, v, g, beta, pool, idx, cu_seqlens=cu)
    for n in refused:
        assert torch.equal(pool[idx[n]], before[idx[n]])


@pytest.mark.single_op
def test_the_public_decode_reads_no_values_on_the_host_where_the_kernel_guards_them(gen, monkeypatch):
    """By default the host checks that read the slots and offsets (a device-to-host sync) run only for
    a backend whose kernel does not check them; GDN_VALUE_CHECKS=1 runs them everywhere (debugging)."""
    B, HV, K, V = 3, 2, 8, 8
    q, k, v, g, beta = make_inputs(gen, B, 1, 1, HV, K, V)
    pool = random_pool(gen, 4, HV, K, V)
    repeated = torch.tensor([1, 2, 1], device=DEVICE)
    host_reads = []
    for name in ("_slot_values", "_offset_values"):
        original = getattr(_validate.Checker, name)
        monkeypatch.setattr(
            _validate.Checker, name, lambda self, *a, _o=original, _n=name: host_reads.append(_n) or _o(self, *a)
        )
    with compute_mode_override("triton"):
        gdn.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, torch.tensor([0, 2, 3], device=DEVICE))
        host_reads.clear()  # the resolution's numeric probe validated its own calls
        o = gdn.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, repeated)
    assert host_reads == [] and o[[0, 2]].isnan().all() and not o[1].isnan().any()
    monkeypatch.setenv("GDN_VALUE_CHECKS", "1")
    with compute_mode_override("triton"), pytest.raises(ValueError, match="distinct live slots"):
        gdn.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, repeated)
    monkeypatch.delenv("GDN_VALUE_CHECKS")
    with compute_mode_override("eager"), pytest.raises(ValueError, match="distinct live slots"):
        gdn.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, repeated)
    assert host_reads == ["_slot_values", "_slot_values"]


@pytest.mark.single_op
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a host sync exists only with a CUDA device")
def test_the_public_decode_does_not_synchronize_the_host(gen):
    B, HV, K, V = 8, 4, 32, 32
    q, k, v, g, beta = make_inputs(gen, B, 1, 2, HV, K, V)
    pool = random_pool(gen, 2 * B, HV, K, V)
    idx = torch.randperm(2 * B, device=DEVICE)[:B].to(torch.int32)
    with torch.no_grad():
        gdn.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, idx)  # resolve, probe, compile
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(2):  # the step prepared from a validated call, then that step
                gdn.fused_recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, idx)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.single_op
def test_decode_steps_equal_the_chunk_op(gen):
    """N one-token decode steps through the pool give eager's chunk output and final state."""
    steps, B, HV, K, V = 6, 2, 2, 16, 16
    q, k, v, g, beta = make_inputs(gen, B, steps, 1, HV, K, V)
    h0 = random_pool(gen, B, HV, K, V)
    pool = torch.zeros(3, HV, K, V, device=DEVICE)
    indices = torch.tensor([2, 0], dtype=torch.int32, device=DEVICE)
    pool[indices.long()] = h0
    outs = [
        run(
            decode.fused_recurrent_gated_delta_rule_update,
            POOL,
            *(x[:, t : t + 1] for x in (q, k, v, g, beta)),
            pool,
            indices,
            use_qk_l2norm_in_kernel=True,
        )
        for t in range(steps)
    ]
    o, final = run(
        EAGER.ops["chunk_gated_delta_rule"],
        "chunk_gated_delta_rule",
        q,
        k,
        v,
        g,
        beta,
        initial_state=h0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    assert rel_err(torch.cat(outs, dim=1), o) <= 1e-5
    assert rel_err(pool[indices.long()], final) <= 1e-5


@pytest.mark.single_op
def test_forward_only_refuses_inputs_that_need_gradients(gen):
    q, k, v, g, beta = make_inputs(gen, 1, 2, 1, 1, 8, 8)
    q.requires_grad_(True)
    with pytest.raises(NotImplementedError, match=r"forward only .* q require grad"):
        run(decode.fused_recurrent_gated_delta_rule, PLAIN, q, k, v, g, beta=beta)
    pool = random_pool(gen, 1, 1, 8, 8)
    indices = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(NotImplementedError, match="forward only"):
        run(decode.fused_recurrent_gated_delta_rule_update, POOL, q, k, v, g, beta, pool, indices)
    with torch.no_grad():
        o, _ = run(decode.fused_recurrent_gated_delta_rule, PLAIN, q, k, v, g, beta=beta)
    assert o.shape == v.shape


@pytest.mark.single_op
def test_the_launch_takes_the_pools_layout_from_its_strides(gen, monkeypatch):
    """A value-first pool ([slots, HV, V, K], state_v_first) gets the value-first walk with no flag but
    the strides the call's transposed view has; the key-first pool keeps its own. Both give the same
    outputs and write the same states, each pool in its layout."""
    seen = []
    step = decode._step

    def recording(*args):
        seen.append(args[7])  # v_first
        return step(*args)

    monkeypatch.setattr(decode, "_step", recording)
    q, k, v, g, beta = make_inputs(gen, 3, 1, 2, 4, 16, 8)
    key_first = random_pool(gen, 5, 4, 16, 8).to(torch.bfloat16)
    value_first = key_first.transpose(-1, -2).contiguous()
    indices = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        o_key = run(decode.fused_recurrent_gated_delta_rule_update, POOL, q, k, v, g, beta, key_first, indices)
        o_value = run(
            decode.fused_recurrent_gated_delta_rule_update,
            POOL,
            q,
            k,
            v,
            g,
            beta,
            value_first,
            indices,
            state_v_first=True,
        )
    assert seen == [False, True]
    assert rel_err(o_value, o_key) <= TOL[torch.bfloat16]
    assert rel_err(value_first, key_first.transpose(-1, -2)) <= TOL[torch.bfloat16]


@pytest.mark.single_op
def test_launch_config_heuristic(monkeypatch):
    monkeypatch.setattr(decode, "processors", lambda device: 132)
    gpu = torch.device("cuda", 0)

    def pick(N, K=128, V=128):
        cfg = decode.launch_config(N, 16, 32, K, V, gpu)
        return cfg.BV, cfg.num_warps

    assert pick(64) == (32, 1)  # enough programs: the widest slice, 128 values per thread
    assert pick(256) == (32, 1)
    assert pick(4) == (16, 1)  # 4 * 32 * 4 programs would leave the SMs short of loads in flight
    assert pick(1) == (8, 1)
    assert pick(256, K=256) == (16, 1)  # the register budget caps the tile
    assert pick(256, K=512) == (8, 1)

    def walk(N, K=128, state_bytes=4, v_first=False):  # one token a sequence
        cfg = decode.launch_config(N, 16, 32, K, 128, gpu, one_token=True, state_bytes=state_bytes, v_first=v_first)
        return cfg.BV, cfg.num_warps, cfg.SLICES, cfg.STAGES, cfg.BLOCK_N

    # 4096 programs, each walking both 64-column slices of the two value heads of a q/k head
    assert walk(256) == (64, 4, 4, 3, 32)
    assert walk(256, state_bytes=2) == (64, 2, 4, 3, 32)  # a bf16 pool: 128 state elements a thread
    assert walk(64) == (64, 4, 4, 3, 32)  # 1024 programs: about 8 an SM
    assert walk(32) == (64, 4, 2, 3, 32)  # 512 walks of four would be short of programs: pairs
    assert walk(1, state_bytes=2) == (64, 2, 1, 1, 32)
    assert walk(256, K=256) == (64, 8, 4, 3, 32)  # 64 state elements a thread
    assert walk(256, K=256, state_bytes=2) == (64, 8, 4, 3, 32)  # fewer a thread past K = 128
    # a value-first bf16 pool: 32-column slices over one warp, eight to a walk while programs allow
    assert walk(256, state_bytes=2, v_first=True) == (32, 1, 8, 3, 32)
    assert walk(64, state_bytes=2, v_first=True) == (32, 1, 8, 3, 32)
    assert walk(16, state_bytes=2, v_first=True) == (32, 1, 2, 3, 32)
    assert walk(256, v_first=True) == walk(256)  # fp32 ran the same in either layout
    assert decode.launch_config(256, 16, 48, 128, 128, gpu, one_token=True).SLICES == 2  # 3 heads of 2 slices
    monkeypatch.setattr(decode, "OVERRIDES", {"SLICES": 3})
    with pytest.raises(ValueError, match="SLICES=3 must divide the 4 V slices"):
        walk(256)
    monkeypatch.setattr(decode, "OVERRIDES", {"BV": 32, "num_warps": 8})
    assert pick(64) == (32, 8)
    monkeypatch.setattr(decode, "OVERRIDES", {"bv": 64})
    with pytest.raises(KeyError, match="bv"):
        pick(64)


# ---------------------------------------------------------------------------------------------------
# the GPU compiler

DECODE_SCENARIO = """
from gdn.backends.triton import decode
from gdn.calls import PREPARE

def call(op, B, T, K=128, V=128, cu=None, pool_dtype=torch.float32, **kwargs):
    q = torch.randn(B, T, 16, K, dtype=torch.bfloat16)
    v = torch.randn(B, T, 32, V, dtype=torch.bfloat16)
    g, beta = torch.randn(B, T, 32), torch.rand(B, T, 32, dtype=torch.bfloat16)
    if op.endswith("_update"):
        N = B if cu is None else len(cu) - 1
        inner = (V, K) if kwargs.get("state_v_first") else (K, V)
        pool = torch.zeros(2 * N, 32, *inner, dtype=pool_dtype)
        kwargs.update(ssm_pool=pool, ssm_indices=torch.arange(N, dtype=torch.int32))
    if cu is not None:
        kwargs["cu_seqlens"] = torch.tensor(cu)
    prepared = PREPARE[op](q, q, v, g, beta=beta, use_qk_l2norm_in_kernel=True, **kwargs)
    return record(decode, lambda: getattr(decode, op)(prepared))["_recurrent_kernel"][0]

POOL = "fused_recurrent_gated_delta_rule_update"
PLAIN = "fused_recurrent_gated_delta_rule"
decode.processors = lambda device: 132
RESULT["usage"] = {}
for BV, warps in ((64, 4), (32, 4), (32, 1), (16, 2), (8, 1)):  # two tokens a sequence: one slice a program
    decode.OVERRIDES.update(BV=BV, num_warps=warps)
    RESULT["usage"][f"pool T=2 BV={BV} warps={warps}"] = compile_sm90(call(POOL, 256, 2))
for knobs in ({}, {"BV": 32, "num_warps": 2}, {"BV": 16, "num_warps": 1, "STAGES": 4}, {"BV": 8, "num_warps": 1}):
    decode.OVERRIDES.clear()
    decode.OVERRIDES.update(knobs)  # one token a sequence: pipelined walks over the slices
    for dtype in (torch.float32, torch.bfloat16):
        RESULT["usage"][f"pool T=1 {knobs} {dtype}"] = compile_sm90(call(POOL, 256, 1, pool_dtype=dtype))
decode.OVERRIDES.clear()
for dtype in (torch.float32, torch.bfloat16):  # a value-first pool: its own binary and walk
    RESULT["usage"][f"value-first pool T=1 {dtype}"] = compile_sm90(
        call(POOL, 256, 1, pool_dtype=dtype, state_v_first=True)
    )
for dtype in (torch.float32, torch.bfloat16):
    RESULT["usage"][f"pool T=1 K=V=256 {dtype}"] = compile_sm90(call(POOL, 256, 1, K=256, V=256, pool_dtype=dtype))
RESULT["usage"]["plain varlen K=V=256"] = compile_sm90(
    call(PLAIN, 1, 9, K=256, V=256, cu=[0, 4, 9], initial_state=torch.zeros(2, 32, 256, 256), output_final_state=True)
)
RESULT["keys"] = {
    "plain": len({launch_key(call(PLAIN, 2, T)) for T in (2, 16, 17, 33)}),
    "pool varlen": len({launch_key(call(POOL, 1, T, cu=[0, 1, T])) for T in (1, 16, 17, 33)}),
    "one token or several": len({launch_key(call(POOL, 4, T)) for T in (1, 2)}),
}
"""


@pytest.mark.single_op
def test_compiles_for_hopper_without_spills_and_one_binary_per_length():
    result = run_on_hopper_compiler(DECODE_SCENARIO)
    for name, usage in result["usage"].items():
        assert usage["spill_bytes"] in (0, None), f"{name}: {usage}"
        # the state tile is taken as loaded, not added to a zero tile
        assert usage["zero_adds"] == 0, f"{name}: {usage}"
    # one binary for a step of one token per sequence (pipelined), one for every longer or packed call
    assert result["keys"] == {"plain": 1, "pool varlen": 1, "one token or several": 2}, result["keys"]
