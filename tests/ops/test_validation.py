"""Every bad input to a gdn op gets a ValueError/TypeError that names the argument, says what was
expected and what came, before any backend sees it; never a crash, an IndexError or a wrong answer.

Messages have the form `<op>: argument '<name>' expected <what>, got <actual>` (gdn._validate.Checker).
The first half of this file is one explicit test per listed problem; the second half is Hypothesis:
per op family, a valid random call with one invalidating mutation must raise ValueError/TypeError
blaming a plausible argument, and the same valid call without a mutation must run on CPU and give
finite outputs of the documented shapes.
"""

from __future__ import annotations

import contextlib
import math
import re
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from gdn import ops

pytestmark = pytest.mark.single_op

GDN_OPS = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")
BAD_INDEX_DTYPES = (torch.float32, torch.int16, torch.uint8, torch.bool)


@contextlib.contextmanager
def rejects(exc: type[Exception], arg: str, *fragments: str):
    """The block raises exactly `exc`, its message names `arg` in quotes as the argument at fault, and
    it says what was expected and what came (plus any `fragments`, matched literally)."""
    with pytest.raises(exc, match=re.escape(f"argument '{arg}' expected ")) as info:
        yield info
    message = str(info.value)
    assert type(info.value) is exc, f"{type(info.value).__name__} is not {exc.__name__}: {message}"
    assert ", got " in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """The same shape and dtype on the meta device (a device other than cpu)."""
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def make_gdn(B=2, T=5, H=2, group=2, K=3, V=4, dtype=torch.float32, seed=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    HV = H * group

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    return dict(
        q=rand(B, T, H, K),
        k=rand(B, T, H, K),
        v=rand(B, T, HV, V),
        g=-torch.rand(B, T, HV, generator=gen).to(dtype),
        beta=torch.rand(B, T, HV, generator=gen).to(dtype),
    )


def gdn_state(N: int, inputs: dict, dtype=torch.float32) -> torch.Tensor:
    _, _, HV, V = inputs["v"].shape
    K = inputs["q"].shape[-1]
    return torch.zeros(N, HV, K, V, dtype=dtype)


def run_gdn(op: str, inputs: dict, **kwargs):
    return getattr(ops, op)(**inputs, **kwargs)


def make_pool_call(B=2, T=1, slots=4, **sizes) -> dict:
    inputs = make_gdn(B=B, T=T, **sizes)
    return dict(
        inputs,
        ssm_pool=gdn_state(slots, inputs),
        ssm_indices=torch.arange(B, dtype=torch.int32),
    )


def make_conv_dense(B=2, D=4, T=6, W=3) -> dict:
    return dict(x=torch.randn(B, D, T), weight=torch.randn(D, W), bias=torch.randn(D))


def make_conv_varlen(D=4, W=3, lengths=(2, 3), slots=3) -> dict:
    bounds = [0, *np.cumsum(lengths).tolist()]
    return dict(
        x=torch.randn(D, bounds[-1]),
        weight=torch.randn(D, W),
        bias=torch.randn(D),
        query_start_loc=torch.tensor(bounds, dtype=torch.int32),
        conv_states=torch.zeros(slots, D, W - 1),
        cache_indices=torch.arange(len(lengths), dtype=torch.int32),
        has_initial_state=torch.ones(len(lengths), dtype=torch.bool),
    )


def make_conv_update(B=2, D=4, W=3, state_len=2, slots=3, L=None) -> dict:
    return dict(
        x=torch.randn(B, D) if L is None else torch.randn(B, D, L),
        conv_state=torch.zeros(slots, D, state_len),
        weight=torch.randn(D, W),
        bias=torch.randn(D),
        conv_state_indices=torch.arange(B, dtype=torch.int32),
    )


def make_gating(lead=(2, 3), HV=4) -> dict:
    return dict(A_log=torch.randn(HV), a=torch.randn(*lead, HV), b=torch.randn(*lead, HV), dt_bias=torch.randn(HV))


# ---------------------------------------------------------------------------------------------------
# The valid baselines run: otherwise every rejection below could be a rejection of everything.


@pytest.mark.parametrize("op", GDN_OPS)
def test_valid_gdn_baseline_runs(op):
    inputs = make_gdn()
    o, final = run_gdn(op, inputs, initial_state=gdn_state(2, inputs), output_final_state=True)
    assert o.shape == (2, 5, 4, 4) and final.shape == (2, 4, 3, 4) and final.dtype == torch.float32
    packed = make_gdn(B=1, T=7)
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int64)
    o, final = run_gdn(op, packed, cu_seqlens=cu, initial_state=gdn_state(3, packed), output_final_state=True)
    assert o.shape == (1, 7, 4, 4) and final.shape == (3, 4, 3, 4)
    assert torch.isfinite(o).all() and torch.isfinite(final).all()


def test_valid_other_baselines_run():
    call = make_pool_call()
    call["ssm_indices"] = torch.tensor([-1, 2], dtype=torch.int64)
    assert ops.fused_recurrent_gated_delta_rule_update(**call).shape == (2, 1, 4, 4)
    assert ops.causal_conv1d_fn(**make_conv_dense()).shape == (2, 4, 6)
    assert ops.causal_conv1d_fn(**make_conv_varlen()).shape == (4, 5)
    assert ops.causal_conv1d_update(**make_conv_update()).shape == (2, 4)
    assert ops.l2norm(torch.randn(3, 5), eps=1e-5).shape == (3, 5)
    g, beta = ops.fused_gdn_gating(**make_gating())
    assert g.shape == beta.shape == (2, 3, 4)


# ---------------------------------------------------------------------------------------------------
# chunk_gated_delta_rule and fused_recurrent_gated_delta_rule: cu_seqlens


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int16, torch.bool])
def test_cu_seqlens_must_be_int32_or_int64(op, dtype):
    cu = torch.tensor([0, 2, 5]).to(dtype)
    with rejects(TypeError, "cu_seqlens", "int32 or int64", str(dtype).removeprefix("torch.")):
        run_gdn(op, make_gdn(B=1), cu_seqlens=cu)


@pytest.mark.parametrize("op", GDN_OPS)
def test_cu_seqlens_must_start_at_zero(op):
    with rejects(ValueError, "cu_seqlens", "first entry 0", "got 1"):
        run_gdn(op, make_gdn(B=1), cu_seqlens=torch.tensor([1, 3, 5], dtype=torch.int32))


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("last", [4, 6, 0])
def test_cu_seqlens_must_end_at_T(op, last):
    cu = torch.tensor([0, 0, last], dtype=torch.int32)
    with rejects(ValueError, "cu_seqlens", "last entry 5", f"got {last}"):
        run_gdn(op, make_gdn(B=1, T=5), cu_seqlens=cu)


@pytest.mark.parametrize("op", GDN_OPS)
def test_cu_seqlens_must_not_decrease(op):
    cu = torch.tensor([0, 4, 2, 5], dtype=torch.int64)
    with rejects(ValueError, "cu_seqlens", "non-decreasing", "cu_seqlens[2] = 2 < cu_seqlens[1] = 4"):
        run_gdn(op, make_gdn(B=1, T=5), cu_seqlens=cu)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("cu", [[0], [], [[0, 5]]], ids=["one-entry", "empty", "2-D"])
def test_cu_seqlens_must_be_1d_with_two_entries(op, cu):
    with rejects(ValueError, "cu_seqlens", "[N + 1]"):
        run_gdn(op, make_gdn(B=1, T=5), cu_seqlens=torch.tensor(cu, dtype=torch.int32))


@pytest.mark.parametrize("op", GDN_OPS)
def test_cu_seqlens_needs_batch_of_one(op):
    with rejects(ValueError, "q", "B = 1 when cu_seqlens is given", "got B = 2"):
        run_gdn(op, make_gdn(B=2, T=5), cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))


@pytest.mark.parametrize("op", GDN_OPS)
def test_cu_seqlens_must_be_a_tensor(op):
    with rejects(TypeError, "cu_seqlens", "a torch.Tensor", "got list"):
        run_gdn(op, make_gdn(B=1, T=5), cu_seqlens=[0, 2, 5])


# initial_state


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("dim", range(4))
def test_initial_state_wrong_shape_dense(op, dim):
    inputs = make_gdn(B=2, H=2, group=2, K=3, V=4)  # state [2, 4, 3, 4]
    shape = [2, 4, 3, 4]
    shape[dim] += 1
    with rejects(ValueError, "initial_state", "[N, HV, K, V]", "[2, 4, 3, 4]", f"got {shape}"):
        run_gdn(op, inputs, initial_state=torch.zeros(shape))


@pytest.mark.parametrize("op", GDN_OPS)
def test_initial_state_wrong_shape_varlen(op):
    """With cu_seqlens the state has one row per packed sequence (N = 3 here), not one per batch row."""
    inputs = make_gdn(B=1, T=6)
    cu = torch.tensor([0, 2, 4, 6], dtype=torch.int32)
    with rejects(ValueError, "initial_state", "number of sequences in cu_seqlens", "[3, 4, 3, 4]", "got [1, 4, 3, 4]"):
        run_gdn(op, inputs, cu_seqlens=cu, initial_state=gdn_state(1, inputs))
    with rejects(ValueError, "initial_state", "[3, 4, 3, 4]", "got [3, 4, 4, 3]"):
        run_gdn(op, inputs, cu_seqlens=cu, initial_state=torch.zeros(3, 4, 4, 3))


@pytest.mark.parametrize("op", GDN_OPS)
def test_initial_state_wrong_ndim(op):
    inputs = make_gdn(B=1)
    with rejects(ValueError, "initial_state", "[N, HV, K, V]", "got [4, 3, 4]"):
        run_gdn(op, inputs, initial_state=torch.zeros(4, 3, 4))


@pytest.mark.parametrize("op", GDN_OPS)
def test_initial_state_dtype_and_type(op):
    inputs = make_gdn()
    with rejects(TypeError, "initial_state", "fp64", "got float64"):
        run_gdn(op, inputs, initial_state=gdn_state(2, inputs, torch.float64))
    with rejects(TypeError, "initial_state", "got int32"):
        run_gdn(op, inputs, initial_state=gdn_state(2, inputs, torch.int32))
    with rejects(TypeError, "initial_state", "a torch.Tensor", "got numpy.ndarray"):
        run_gdn(op, inputs, initial_state=gdn_state(2, inputs).numpy())


# heads, shapes, ndim


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("HV", [3, 5, 1])
def test_value_heads_must_be_a_multiple_of_H(op, HV):
    inputs = make_gdn(H=2, group=1)
    inputs["v"] = torch.randn(2, 5, HV, 4)
    inputs["g"] = -torch.rand(2, 5, HV)
    inputs["beta"] = torch.rand(2, 5, HV)
    with rejects(ValueError, "v", "multiple of H = 2", f"got HV = {HV}"):
        run_gdn(op, inputs)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
@pytest.mark.parametrize("change", ["unsqueeze", "squeeze"])
def test_wrong_ndim(op, name, change):
    inputs = make_gdn()
    t = inputs[name]
    inputs[name] = t.unsqueeze(0) if change == "unsqueeze" else t.flatten(-2)
    with rejects(ValueError, name, f"got {list(inputs[name].shape)}" if name in ("k", "g", "beta") else "-D"):
        run_gdn(op, inputs)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("dim", range(4))
def test_k_shape_must_match_q(op, dim):
    inputs = make_gdn()
    shape = list(inputs["k"].shape)
    shape[dim] += 1
    inputs["k"] = torch.randn(shape)
    with rejects(ValueError, "k", "(same as q) = [2, 5, 2, 3]", f"got {shape}"):
        run_gdn(op, inputs)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("dim", range(2))
def test_v_batch_and_time_must_match_q(op, dim):
    inputs = make_gdn()
    shape = list(inputs["v"].shape)
    shape[dim] += 1
    inputs["v"] = torch.randn(shape)
    with rejects(ValueError, "v", "B, T = 2, 5", f"got {shape}"):
        run_gdn(op, inputs)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("name", ["g", "beta"])
@pytest.mark.parametrize("shape", [[2, 5, 3], [2, 4, 4], [1, 5, 4], [2, 5, 4, 1], [2, 5, 2]])
def test_g_and_beta_must_be_B_T_HV(op, name, shape):
    inputs = make_gdn()  # HV = 4
    inputs[name] = torch.rand(shape)
    with rejects(ValueError, name, "[B, T, HV] = [2, 5, 4]", f"got {shape}"):
        run_gdn(op, inputs)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("dim", range(4))
def test_empty_dimensions_are_rejected(op, dim):
    inputs = make_gdn()
    shape = list(inputs["q"].shape)
    shape[dim] = 0
    inputs["q"] = torch.randn(shape)
    inputs["k"] = torch.randn(shape)
    with rejects(ValueError, "q", ">= 1", "got 0"):
        run_gdn(op, inputs)


# dtypes


@pytest.mark.parametrize("op", GDN_OPS)
def test_fp64_inputs_are_a_type_error_mentioning_fp64(op):
    everything = {name: t.double() for name, t in make_gdn().items()}
    with rejects(TypeError, "q", "fp64", "got float64"):
        run_gdn(op, everything)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("name", ["k", "v", "g", "beta"])
def test_one_fp64_input_is_a_type_error_mentioning_fp64(op, name):
    inputs = make_gdn()
    inputs[name] = inputs[name].double()
    with rejects(TypeError, name, "fp64", "got float64"):
        run_gdn(op, inputs)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("name", ["k", "v"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_q_k_v_dtypes_must_match(op, name, dtype):
    inputs = make_gdn()
    inputs[name] = inputs[name].to(dtype)
    with rejects(TypeError, name, "dtype float32 (same as 'q')", f"got {str(dtype).removeprefix('torch.')}"):
        run_gdn(op, inputs)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("name", ["q", "g", "beta"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64])
def test_non_float_dtypes_are_rejected(op, name, dtype):
    inputs = make_gdn()
    if name == "q":  # keep q, k, v consistent so that q's own dtype check is the one that fires
        for n in ("q", "k", "v"):
            inputs[n] = inputs[n].to(dtype)
    else:
        inputs[name] = inputs[name].to(dtype)
    with rejects(TypeError, name, "dtype in (bfloat16, float16, float32)", str(dtype).removeprefix("torch.")):
        run_gdn(op, inputs)


# devices


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("name", ["k", "v", "g", "beta", "initial_state", "cu_seqlens"])
def test_tensors_must_share_a_device(op, name):
    inputs = make_gdn(B=1, T=5)
    extra = dict(initial_state=gdn_state(2, inputs), cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32))
    if name in extra:
        extra[name] = meta_like(extra[name])
    else:
        inputs[name] = meta_like(inputs[name])
    with rejects(ValueError, name, "device cpu (same as 'q')", "got device meta"):
        run_gdn(op, inputs, **extra)


@pytest.mark.parametrize("op", GDN_OPS)
def test_q_on_another_device_blames_the_first_mismatch(op):
    inputs = make_gdn()
    inputs["q"] = meta_like(inputs["q"])
    with rejects(ValueError, "k", "device meta (same as 'q')", "got device cpu"):
        run_gdn(op, inputs)


# the legacy layout, non-tensors, scale and flags


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("head_first", [True, 1, None, "yes"])
def test_head_first_is_rejected(op, head_first):
    with rejects(ValueError, "head_first", "legacy head-first [B, H, T, K] layout was removed", repr(head_first)):
        run_gdn(op, make_gdn(), head_first=head_first)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
@pytest.mark.parametrize("kind", ["list", "numpy.ndarray", "NoneType", "float"])
def test_non_tensor_inputs(op, name, kind):
    inputs = make_gdn()
    t = inputs[name]
    inputs[name] = {"list": t.tolist(), "numpy.ndarray": t.numpy(), "NoneType": None, "float": 1.0}[kind]
    with rejects(TypeError, name, "a torch.Tensor", f"got {kind}"):
        run_gdn(op, inputs)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize(
    "scale",
    [-1.0, 0.0, 0, -3, math.nan, math.inf, -math.inf, 10**400, np.float32(0.0), np.float16(np.inf), np.int8(-2)],
)
def test_bad_scale_value(op, scale):
    with rejects(ValueError, "scale", "positive real number (finite and > 0)"):
        run_gdn(op, make_gdn(), scale=scale)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize(
    ("scale", "got"),
    [
        ("0.5", "str"),
        (True, "bool"),
        (np.bool_(True), "numpy.bool"),
        ([0.5], "list"),
        (torch.tensor(0.5), "torch.Tensor"),
        (np.array(0.5), "numpy.ndarray"),
        (Decimal("0.5"), "decimal.Decimal"),
    ],
)
def test_bad_scale_type(op, scale, got):
    with rejects(TypeError, "scale", "None or a positive real number", f"got {got}"):
        run_gdn(op, make_gdn(), scale=scale)


REAL_SCALES = [np.float32(0.5), np.float16(0.5), np.float64(0.5), np.int64(2), 2, Fraction(1, 2)]


@pytest.mark.parametrize("op", [*GDN_OPS, "fused_recurrent_gated_delta_rule_update"])
@pytest.mark.parametrize("scale", REAL_SCALES, ids=lambda s: f"{type(s).__name__}({s})")
def test_scale_takes_any_real_number_as_the_float_it_equals(op, scale):
    """numpy scalars, ints and fractions are real numbers: the op computes with float(scale), converted
    once at validation (a backend's call holds a Python float)."""
    from gdn.calls import PREPARE

    make = make_pool_call if op.endswith("_update") else make_gdn
    got, want = make(), make()
    with torch.no_grad():
        out = getattr(ops, op)(**got, scale=scale)
        ref = getattr(ops, op)(**want, scale=float(scale))
    for a, b in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,), strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    call = PREPARE[op](**make(), scale=scale)
    assert type(call.scale) is float and call.scale == float(scale)


@pytest.mark.parametrize("op", GDN_OPS)
@pytest.mark.parametrize("flag", ["output_final_state", "use_qk_l2norm_in_kernel"])
@pytest.mark.parametrize(
    ("value", "got"),
    [
        (1, "int"),
        (0, "int"),
        (None, "NoneType"),
        ("True", "str"),
        (np.bool_(True), "numpy."),
        (torch.tensor(True), "torch.Tensor"),
    ],
)
def test_flags_must_be_bool(op, flag, value, got):
    with rejects(TypeError, flag, "a bool", f"got {got}"):
        run_gdn(op, make_gdn(), **{flag: value})


# ---------------------------------------------------------------------------------------------------
# fused_recurrent_gated_delta_rule_update (decode against a state pool)

POOL_OP = ops.fused_recurrent_gated_delta_rule_update


@pytest.mark.parametrize("name", ["ssm_pool", "ssm_indices"])
def test_pool_and_indices_are_required(name):
    call = make_pool_call()
    call[name] = None
    with rejects(TypeError, name, "a torch.Tensor", "got NoneType"):
        POOL_OP(**call)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_pool_must_be_fp32_bf16_or_fp16(dtype):
    call = make_pool_call()
    call["ssm_pool"] = call["ssm_pool"].to(dtype)
    fragments = ["dtype in (bfloat16, float16, float32)", f"got {str(dtype).removeprefix('torch.')}"]
    with rejects(TypeError, "ssm_pool", *fragments, *(["fp64"] if dtype == torch.float64 else [])):
        POOL_OP(**call)


@pytest.mark.parametrize("shape", [[4, 3, 3, 4], [4, 4, 2, 4], [4, 4, 3, 5], [4, 4, 3], [4, 4, 3, 4, 1], [0, 4, 3, 4]])
def test_pool_wrong_shape(shape):
    call = make_pool_call(slots=4)  # pool [4, HV=4, K=3, V=4]
    call["ssm_pool"] = torch.zeros(shape)
    with rejects(ValueError, "ssm_pool", "max_slots", f"{shape}" if len(shape) != 4 or shape[0] else "got 0"):
        POOL_OP(**call)


@pytest.mark.parametrize("indices", [[0, 4], [5, 0], [-2, 1], [0, -100]])
def test_pool_index_out_of_range(indices):
    call = make_pool_call(slots=4)
    call["ssm_indices"] = torch.tensor(indices, dtype=torch.int32)
    bad = next(i for i in indices if not 0 <= i < 4)
    with rejects(ValueError, "ssm_indices", "slots in [0, 4) of 'ssm_pool' or -1", f"= {bad}"):
        POOL_OP(**call)


def test_pool_duplicate_live_indices():
    call = make_pool_call(B=3, slots=4)
    call["ssm_indices"] = torch.tensor([2, -1, 2], dtype=torch.int64)
    with rejects(ValueError, "ssm_indices", "distinct live slots", "ssm_indices[0] = ssm_indices[2] = 2"):
        POOL_OP(**call)


def test_pool_repeated_skip_index_is_fine():
    call = make_pool_call(B=3, slots=4)
    call["ssm_indices"] = torch.tensor([-1, 1, -1], dtype=torch.int64)
    before = call["ssm_pool"].clone()
    o = POOL_OP(**call)
    assert (o[0] == 0).all() and (o[2] == 0).all()
    changed = [s for s in range(4) if not torch.equal(call["ssm_pool"][s], before[s])]
    assert changed == [1]


@pytest.mark.parametrize("dtype", BAD_INDEX_DTYPES)
def test_pool_index_dtype(dtype):
    call = make_pool_call()
    call["ssm_indices"] = call["ssm_indices"].to(dtype)
    with rejects(TypeError, "ssm_indices", "int32 or int64", str(dtype).removeprefix("torch.")):
        POOL_OP(**call)


@pytest.mark.parametrize("indices", [[0], [0, 1, 2], [[0, 1]]])
def test_pool_index_count_is_one_per_sequence(indices):
    call = make_pool_call(B=2)
    call["ssm_indices"] = torch.tensor(indices, dtype=torch.int32)
    with rejects(ValueError, "ssm_indices", "a 1-D tensor [2]", f"got shape {list(call['ssm_indices'].shape)}"):
        POOL_OP(**call)


def test_pool_index_count_follows_cu_seqlens():
    call = make_pool_call(B=1, T=4)
    call["cu_seqlens"] = torch.tensor([0, 1, 3, 4], dtype=torch.int32)  # N = 3 sequences, 1 index given
    call["ssm_indices"] = torch.tensor([0], dtype=torch.int32)
    with rejects(ValueError, "ssm_indices", "a 1-D tensor [3]"):
        POOL_OP(**call)


@pytest.mark.parametrize("name", ["ssm_pool", "ssm_indices"])
def test_pool_device(name):
    call = make_pool_call()
    call[name] = meta_like(call[name])
    with rejects(ValueError, name, "same as 'q'", "got device meta"):
        POOL_OP(**call)


def test_pool_decode_shares_the_gdn_checks():
    call = make_pool_call()
    call["v"] = call["v"].double()
    with rejects(TypeError, "v", "fp64"):
        POOL_OP(**call)
    call = make_pool_call(B=2)
    call["cu_seqlens"] = torch.tensor([0, 1], dtype=torch.int32)
    with rejects(ValueError, "q", "B = 1 when cu_seqlens is given"):
        POOL_OP(**call)
    with rejects(ValueError, "scale", "finite"):
        POOL_OP(**make_pool_call(), scale=math.nan)
    with rejects(TypeError, "use_qk_l2norm_in_kernel", "a bool"):
        POOL_OP(**make_pool_call(), use_qk_l2norm_in_kernel="no")


# ---------------------------------------------------------------------------------------------------
# causal_conv1d_fn, dense mode: x [B, D, T], weight [D, W]

CONV_FN = ops.causal_conv1d_fn


def test_conv_fn_dense_x():
    with rejects(TypeError, "x", "a torch.Tensor", "got list"):
        CONV_FN(torch.randn(2, 4, 6).tolist(), torch.randn(4, 3))
    with rejects(TypeError, "x", "fp64", "got float64"):
        CONV_FN(torch.randn(2, 4, 6, dtype=torch.float64), torch.randn(4, 3))
    with rejects(TypeError, "x", "got int64"):
        CONV_FN(torch.zeros(2, 4, 6, dtype=torch.int64), torch.randn(4, 3))
    with rejects(ValueError, "x", "3-D tensor [B, D, T]", "got 2-D shape [4, 6]"):
        CONV_FN(torch.randn(4, 6), torch.randn(4, 3))
    with rejects(ValueError, "x", "length T >= 1", "got 0"):
        CONV_FN(torch.randn(2, 4, 0), torch.randn(4, 3))


def test_conv_fn_dense_weight_and_bias():
    x = torch.randn(2, 4, 6)
    with rejects(TypeError, "weight", "a torch.Tensor", "got NoneType"):
        CONV_FN(x, None)
    with rejects(ValueError, "weight", "D = 4 (channels of x)", "got [5, 3]"):
        CONV_FN(x, torch.randn(5, 3))
    with rejects(ValueError, "weight", "2-D tensor [D, W]", "got 3-D shape [4, 1, 3]"):
        CONV_FN(x, torch.randn(4, 1, 3))
    with rejects(ValueError, "weight", "kernel width W >= 1", "got 0"):
        CONV_FN(x, torch.randn(4, 0))
    with rejects(TypeError, "weight", "fp64"):
        CONV_FN(x, torch.randn(4, 3, dtype=torch.float64))
    with rejects(ValueError, "bias", "[D] = [4]", "got [3]"):
        CONV_FN(x, torch.randn(4, 3), torch.randn(3))
    with rejects(TypeError, "bias", "fp64"):
        CONV_FN(x, torch.randn(4, 3), torch.randn(4, dtype=torch.float64))
    with rejects(TypeError, "bias", "a torch.Tensor", "got float"):
        CONV_FN(x, torch.randn(4, 3), 0.5)


@pytest.mark.parametrize("activation", ["relu", "SiLU", 1, True, ["silu"], np.array([1, 2]), torch.tensor([1, 2])])
def test_conv_fn_activation(activation):
    with rejects(ValueError, "activation", "one of [None, 'silu', 'swish']"):
        CONV_FN(**make_conv_dense(), activation=activation)


@pytest.mark.parametrize(("value", "got"), [(1, "int"), (None, "NoneType"), ("yes", "str")])
def test_conv_fn_return_final_states_must_be_bool(value, got):
    with rejects(TypeError, "return_final_states", "a bool", f"got {got}"):
        CONV_FN(**make_conv_dense(), return_final_states=value)


def test_conv_fn_dense_seq_idx_and_initial_states():
    call = make_conv_dense(B=2, D=4, T=6, W=3)
    with rejects(TypeError, "seq_idx", "int32 or int64", "got dtype float32"):
        CONV_FN(**call, seq_idx=torch.zeros(2, 6))
    with rejects(ValueError, "seq_idx", "[B, T] = [2, 6]", "got [2, 5]"):
        CONV_FN(**call, seq_idx=torch.zeros(2, 5, dtype=torch.int32))
    with rejects(ValueError, "initial_states", "[B, D, W - 1] = [2, 4, 2]", "got [2, 4, 3]"):
        CONV_FN(**call, initial_states=torch.zeros(2, 4, 3))
    with rejects(TypeError, "initial_states", "fp64"):
        CONV_FN(**call, initial_states=torch.zeros(2, 4, 2, dtype=torch.float64))
    with rejects(TypeError, "initial_states", "a torch.Tensor", "got list"):
        CONV_FN(**call, initial_states=[[0.0]])


@pytest.mark.parametrize("name", ["conv_states", "cache_indices", "has_initial_state"])
def test_conv_fn_varlen_arguments_need_query_start_loc(name):
    value = make_conv_varlen()[name]
    with rejects(ValueError, name, "None unless query_start_loc is given"):
        CONV_FN(**make_conv_dense(), **{name: value})


@pytest.mark.parametrize("name", ["weight", "bias", "seq_idx", "initial_states"])
def test_conv_fn_dense_devices(name):
    call = dict(make_conv_dense(), seq_idx=torch.zeros(2, 6, dtype=torch.int32), initial_states=torch.zeros(2, 4, 2))
    call[name] = meta_like(call[name])
    with rejects(ValueError, name, "device cpu (same as 'x')", "got device meta"):
        CONV_FN(**call)


# causal_conv1d_fn, varlen mode: x [D, total_T], query_start_loc [N + 1]


@pytest.mark.parametrize(
    ("qsl", "exc", "fragment"),
    [
        (torch.tensor([0.0, 2.0, 5.0]), TypeError, "int32 or int64"),
        (torch.tensor([1, 2, 5]), ValueError, "first entry 0"),
        (torch.tensor([0, 2, 4]), ValueError, "last entry 5"),
        (torch.tensor([0, 3, 2, 5]), ValueError, "non-decreasing"),
        (torch.tensor([5]), ValueError, "[N + 1]"),
        (torch.tensor([[0, 5]]), ValueError, "[N + 1]"),
    ],
    ids=["float", "start", "end", "decreasing", "one-entry", "2-D"],
)
def test_conv_fn_varlen_query_start_loc(qsl, exc, fragment):
    with rejects(exc, "query_start_loc", fragment):
        CONV_FN(torch.randn(4, 5), torch.randn(4, 3), query_start_loc=qsl)


def test_conv_fn_varlen_mode_errors():
    call = make_conv_varlen(D=4, W=3, lengths=(2, 3), slots=3)
    with rejects(ValueError, "x", "2-D tensor [D, total_T]", "got 3-D shape [1, 4, 5]"):
        CONV_FN(**dict(call, x=call["x"].unsqueeze(0)))
    with rejects(ValueError, "seq_idx", "None in varlen mode"):
        CONV_FN(**call, seq_idx=torch.zeros(1, 5, dtype=torch.int32))
    with rejects(ValueError, "initial_states", "None in varlen mode"):
        CONV_FN(**call, initial_states=torch.zeros(2, 4, 2))
    with rejects(ValueError, "return_final_states", "False in varlen mode"):
        CONV_FN(**call, return_final_states=True)
    with rejects(ValueError, "weight", "D = 4", "got [3, 3]"):
        CONV_FN(**dict(call, weight=torch.randn(3, 3)))


def test_conv_fn_varlen_has_initial_state():
    call = make_conv_varlen(lengths=(2, 3))
    with rejects(TypeError, "has_initial_state", "a bool tensor", "got dtype int32"):
        CONV_FN(**dict(call, has_initial_state=torch.ones(2, dtype=torch.int32)))
    with rejects(ValueError, "has_initial_state", "[N] (one flag per sequence) = [2]", "got [3]"):
        CONV_FN(**dict(call, has_initial_state=torch.ones(3, dtype=torch.bool)))
    with rejects(ValueError, "conv_states", "when has_initial_state is given", "got None"):
        CONV_FN(**dict(call, conv_states=None, cache_indices=None))


def test_conv_fn_varlen_conv_states():
    call = make_conv_varlen(D=4, W=3, lengths=(2, 3), slots=3)
    with rejects(ValueError, "conv_states", "when cache_indices is given", "got None"):
        CONV_FN(**dict(call, conv_states=None, has_initial_state=None))
    with rejects(ValueError, "conv_states", "[slots, D, W - 1] = [3, 4, 2]", "got [3, 4, 3]"):
        CONV_FN(**dict(call, conv_states=torch.zeros(3, 4, 3)))
    with rejects(ValueError, "conv_states", "3-D tensor", "got 2-D"):
        CONV_FN(**dict(call, conv_states=torch.zeros(3, 8)))
    with rejects(ValueError, "conv_states", "slots >= 1", "got 0"):
        CONV_FN(**dict(call, conv_states=torch.zeros(0, 4, 2)))
    with rejects(TypeError, "conv_states", "fp64"):
        CONV_FN(**dict(call, conv_states=torch.zeros(3, 4, 2, dtype=torch.float64)))
    with rejects(ValueError, "conv_states", "at least N = 2 slots when cache_indices is None", "got 1"):
        CONV_FN(**dict(call, conv_states=torch.zeros(1, 4, 2), cache_indices=None))


@pytest.mark.parametrize(
    ("indices", "exc", "fragment"),
    [
        (torch.tensor([0, 3], dtype=torch.int32), ValueError, "slots in [0, 3) of 'conv_states'"),
        (torch.tensor([-2, 0], dtype=torch.int32), ValueError, "cache_indices[0] = -2"),
        (torch.tensor([1, 1], dtype=torch.int32), ValueError, "distinct live slots"),
        (torch.tensor([0.0, 1.0]), TypeError, "int32 or int64"),
        (torch.tensor([0, 1, 2], dtype=torch.int32), ValueError, "a 1-D tensor [2]"),
    ],
    ids=["too-high", "negative", "duplicate", "float", "count"],
)
def test_conv_fn_varlen_cache_indices(indices, exc, fragment):
    with rejects(exc, "cache_indices", fragment):
        CONV_FN(**dict(make_conv_varlen(lengths=(2, 3), slots=3), cache_indices=indices))


@pytest.mark.parametrize("name", ["weight", "query_start_loc", "conv_states", "cache_indices", "has_initial_state"])
def test_conv_fn_varlen_devices(name):
    call = make_conv_varlen()
    call[name] = meta_like(call[name])
    with rejects(ValueError, name, "device cpu (same as 'x')", "got device meta"):
        CONV_FN(**call)


# ---------------------------------------------------------------------------------------------------
# causal_conv1d_update: x [B, D] or [B, D, L], conv_state [slots, D, state_len >= W - 1]

CONV_UPDATE = ops.causal_conv1d_update


def test_conv_update_x():
    call = make_conv_update()
    with rejects(ValueError, "x", "2-D tensor [B, D] or 3-D tensor [B, D, L]", "got 1-D shape [4]"):
        CONV_UPDATE(**dict(call, x=torch.randn(4)))
    with rejects(ValueError, "x", "got 4-D"):
        CONV_UPDATE(**dict(call, x=torch.randn(2, 4, 1, 1)))
    with rejects(ValueError, "x", "new tokens L >= 1", "got 0"):
        CONV_UPDATE(**dict(call, x=torch.randn(2, 4, 0)))
    with rejects(TypeError, "x", "fp64"):
        CONV_UPDATE(**dict(call, x=torch.randn(2, 4, dtype=torch.float64)))
    with rejects(TypeError, "x", "a torch.Tensor", "got list"):
        CONV_UPDATE(**dict(call, x=[[1.0] * 4] * 2))


def test_conv_update_conv_state():
    call = make_conv_update(B=2, D=4, W=3, state_len=2, slots=3)
    with rejects(TypeError, "conv_state", "a torch.Tensor", "got NoneType"):
        CONV_UPDATE(**dict(call, conv_state=None))
    with rejects(ValueError, "conv_state", "3-D tensor [slots, D, state_len]", "got 2-D"):
        CONV_UPDATE(**dict(call, conv_state=torch.zeros(3, 8)))
    with rejects(ValueError, "conv_state", "D = 4 and state_len >= W - 1 = 2", "got [3, 5, 2]"):
        CONV_UPDATE(**dict(call, conv_state=torch.zeros(3, 5, 2)))
    with rejects(ValueError, "conv_state", "state_len >= W - 1 = 2", "got [3, 4, 1]"):
        CONV_UPDATE(**dict(call, conv_state=torch.zeros(3, 4, 1)))
    with rejects(TypeError, "conv_state", "got int32"):
        CONV_UPDATE(**dict(call, conv_state=torch.zeros(3, 4, 2, dtype=torch.int32)))
    with rejects(ValueError, "conv_state", "2 rows (batch size B) when conv_state_indices is None", "got 3 rows"):
        CONV_UPDATE(**dict(call, conv_state_indices=None))


@pytest.mark.parametrize(
    ("indices", "exc", "fragment"),
    [
        (torch.tensor([0, 3], dtype=torch.int32), ValueError, "slots in [0, 3) of 'conv_state'"),
        (torch.tensor([-5, 0], dtype=torch.int64), ValueError, "conv_state_indices[0] = -5"),
        (torch.tensor([2, 2], dtype=torch.int32), ValueError, "distinct live slots"),
        (torch.tensor([0, 1], dtype=torch.int16), TypeError, "int32 or int64"),
        (torch.tensor([0.0, 1.0]), TypeError, "int32 or int64"),
        (torch.tensor([0], dtype=torch.int32), ValueError, "a 1-D tensor [2]"),
        (torch.tensor([[0, 1]], dtype=torch.int32), ValueError, "a 1-D tensor [2]"),
    ],
    ids=["too-high", "negative", "duplicate", "int16", "float", "short", "2-D"],
)
def test_conv_update_indices(indices, exc, fragment):
    with rejects(exc, "conv_state_indices", fragment):
        CONV_UPDATE(**dict(make_conv_update(B=2, slots=3), conv_state_indices=indices))


def test_conv_update_weight_bias_activation():
    call = make_conv_update(D=4, W=3)
    with rejects(ValueError, "weight", "D = 4", "got [3, 3]"):
        CONV_UPDATE(**dict(call, weight=torch.randn(3, 3)))
    with rejects(ValueError, "conv_state", "state_len >= W - 1 = 4", "got [3, 4, 2]"):
        CONV_UPDATE(**dict(call, weight=torch.randn(4, 5)))
    with rejects(ValueError, "bias", "[D] = [4]", "got [4, 1]"):
        CONV_UPDATE(**dict(call, bias=torch.randn(4, 1)))
    with rejects(ValueError, "activation", "one of", "'gelu'"):
        CONV_UPDATE(**call, activation="gelu")


@pytest.mark.parametrize("name", ["conv_state", "weight", "bias", "conv_state_indices"])
def test_conv_update_devices(name):
    call = make_conv_update()
    call[name] = meta_like(call[name])
    with rejects(ValueError, name, "device cpu (same as 'x')", "got device meta"):
        CONV_UPDATE(**call)


# ---------------------------------------------------------------------------------------------------
# l2norm and fused_gdn_gating


def test_l2norm_x():
    with rejects(TypeError, "x", "a torch.Tensor", "got list"):
        ops.l2norm([1.0, 2.0])
    with rejects(TypeError, "x", "fp64"):
        ops.l2norm(torch.randn(3, 4, dtype=torch.float64))
    with rejects(TypeError, "x", "got int64"):
        ops.l2norm(torch.zeros(3, 4, dtype=torch.int64))
    with rejects(ValueError, "x", "last dimension of size >= 1", "got shape []"):
        ops.l2norm(torch.tensor(1.0))
    with rejects(ValueError, "x", "last dimension of size >= 1", "got shape [3, 0]"):
        ops.l2norm(torch.randn(3, 0))


@pytest.mark.parametrize("eps", [0, 0.0, -1e-6, math.nan, math.inf, 10**400, np.float32(-1e-6)])
def test_l2norm_eps_value(eps):
    with rejects(ValueError, "eps", "a positive real number (finite and > 0)"):
        ops.l2norm(torch.randn(3, 4), eps=eps)


@pytest.mark.parametrize(
    ("eps", "got"),
    [("1e-6", "str"), (None, "NoneType"), (True, "bool"), (torch.tensor(1e-6), "torch.Tensor"), ([1e-6], "list")],
)
def test_l2norm_eps_type(eps, got):
    with rejects(TypeError, "eps", "a positive real number", f"got {got}"):
        ops.l2norm(torch.randn(3, 4), eps=eps)


def test_l2norm_eps_takes_a_numpy_scalar():
    x = torch.randn(3, 4)
    assert torch.equal(ops.l2norm(x, eps=np.float32(0.25)), ops.l2norm(x, eps=float(np.float32(0.25))))


def test_fused_gdn_gating_shapes():
    call = make_gating(lead=(2, 3), HV=4)
    with rejects(ValueError, "A_log", "1-D tensor [HV]", "got 2-D shape [1, 4]"):
        ops.fused_gdn_gating(**dict(call, A_log=torch.randn(1, 4)))
    with rejects(ValueError, "A_log", "head count HV >= 1", "got 0"):
        ops.fused_gdn_gating(**dict(call, A_log=torch.randn(0)))
    with rejects(ValueError, "dt_bias", "[HV] = [4]", "got [5]"):
        ops.fused_gdn_gating(**dict(call, dt_bias=torch.randn(5)))
    with rejects(ValueError, "dt_bias", "[HV] = [4]", "got [1, 4]"):
        ops.fused_gdn_gating(**dict(call, dt_bias=torch.randn(1, 4)))
    with rejects(ValueError, "a", "[..., HV] with HV = 4", "got [2, 3, 5]"):
        ops.fused_gdn_gating(**dict(call, a=torch.randn(2, 3, 5)))
    with rejects(ValueError, "a", "[..., HV] with HV = 4", "got []"):
        ops.fused_gdn_gating(**dict(call, a=torch.tensor(1.0)))
    with rejects(ValueError, "b", "(same as a) = [2, 3, 4]", "got [3, 2, 4]"):
        ops.fused_gdn_gating(**dict(call, b=torch.randn(3, 2, 4)))


@pytest.mark.parametrize("name", ["A_log", "a", "b", "dt_bias"])
def test_fused_gdn_gating_types_and_devices(name):
    call = make_gating()
    with rejects(TypeError, name, "fp64"):
        ops.fused_gdn_gating(**dict(call, **{name: call[name].double()}))
    with rejects(TypeError, name, "a torch.Tensor", "got list"):
        ops.fused_gdn_gating(**dict(call, **{name: call[name].tolist()}))
    blamed = "a" if name == "A_log" else name  # the first tensor sets the device
    with rejects(ValueError, blamed, "(same as 'A_log')"):
        ops.fused_gdn_gating(**dict(call, **{name: meta_like(call[name])}))


# ---------------------------------------------------------------------------------------------------
# Hypothesis. A case is the kwargs of one call. A mutation (one kind per pytest parameter, so every kind
# is exercised on every run) makes it invalid in one way, in place, and returns the argument names the
# error may blame: a mismatch between two arguments can fairly be reported on either side.

MUTATIONS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALID = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

small = st.integers


def random_bounds(draw, total: int, max_sequences: int = 4) -> list[int]:
    """Sorted offsets 0 = b_0 <= ... <= b_N = total (empty sequences allowed)."""
    n = draw(small(1, max_sequences))
    cuts = sorted(draw(st.lists(small(0, total), min_size=n - 1, max_size=n - 1)))
    return [0, *cuts, total]


def resized(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = size
    return torch.zeros(shape, dtype=t.dtype)


def changed_size(draw, size: int) -> int:
    return draw(st.integers(0, size + 3).filter(lambda s: s != size))


def resize_some_dim(draw, t: torch.Tensor, dims) -> torch.Tensor:
    dim = draw(st.sampled_from(list(dims)))
    size = changed_size(draw, t.shape[dim])
    note(f"dim {dim} of {list(t.shape)} -> {size}")
    return resized(t, dim, size)


def other_ndim(draw, t: torch.Tensor) -> torch.Tensor:
    if t.ndim >= 2 and draw(st.booleans()):
        return t.flatten(-2)
    return t.unsqueeze(draw(small(0, t.ndim)))


def non_tensor(draw, t: torch.Tensor, optional: bool):
    choices = ["list", "ndarray", "float", "str"] + ([] if optional else ["None"])
    kind = draw(st.sampled_from(choices))
    return {"list": t.tolist(), "ndarray": t.float().numpy(), "float": 1.0, "str": "tensor", "None": None}[kind]


def bad_float_dtype(draw) -> torch.dtype:
    return draw(st.sampled_from([torch.float64, torch.int32, torch.int64, torch.bool, torch.complex64]))


def pick(draw, names):
    return draw(st.sampled_from(list(names)))


def broken_offsets(draw, bounds: list[int], name: str) -> torch.Tensor:
    """cu_seqlens / query_start_loc made invalid in one way."""
    total = bounds[-1]
    kind = draw(st.sampled_from(["float", "int16", "start", "end", "decreasing", "one-entry", "2-D"]))
    note(f"{name}: {kind}")
    if kind == "float":
        return torch.tensor(bounds, dtype=torch.float32)
    if kind == "int16":
        return torch.tensor(bounds, dtype=torch.int16)
    if kind == "start":
        return torch.tensor([draw(small(1, total + 2)), *bounds[1:]])
    if kind == "end":
        return torch.tensor([*bounds[:-1], draw(st.integers(0, total + 3).filter(lambda s: s != total))])
    if kind == "decreasing":
        return torch.tensor([*bounds[:-1], total + 1 + draw(small(0, 3)), total])
    if kind == "one-entry":
        return torch.tensor(bounds[:1], dtype=torch.int32)
    return torch.tensor([bounds], dtype=torch.int32)


def bad_slots(draw, values: list[int], slots: int) -> list[int]:
    """Pool indices with one live entry out of range, or two rows on one slot."""
    values = list(values)
    if len(values) >= 2 and draw(st.booleans()):
        a, b = draw(st.lists(small(0, len(values) - 1), min_size=2, max_size=2, unique=True))
        values[a] = values[b] = draw(small(0, slots - 1))
    else:
        values[draw(small(0, len(values) - 1))] = draw(st.one_of(small(slots, slots + 5), small(-9, -2)))
    note(f"indices -> {values}")
    return values


def skip_some(draw, slots: int, rows: int) -> list[int]:
    """Distinct slots for `rows` rows, some of them -1 (skip)."""
    live = draw(st.permutations(range(slots)))[:rows]
    skip = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
    return [-1 if s else i for i, s in zip(live, skip, strict=True)]


def assert_rejected(fn, case: dict, blamed: set[str]) -> None:
    """ValueError or TypeError (anything else fails the test), naming one of the `blamed` arguments."""
    with pytest.raises((ValueError, TypeError)) as info:
        fn(**case)
    message = str(info.value)
    named = re.search(r"argument '(\w+)' expected .*, got ", message, flags=re.DOTALL)
    assert named is not None, f"message does not name an argument: {message}"
    assert named.group(1) in blamed, f"blamed {named.group(1)!r}, expected one of {sorted(blamed)}: {message}"


# -- chunk_gated_delta_rule, fused_recurrent_gated_delta_rule and the pool decode -------------------


@st.composite
def gdn_cases(draw, pool: bool = False) -> dict:
    varlen = draw(st.booleans())
    B = 1 if varlen else draw(small(1, 3))
    T = draw(small(1, 20))
    H, group = draw(small(1, 3)), draw(small(1, 3))
    K, V = draw(small(1, 8)), draw(small(1, 8))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    case = make_gdn(B, T, H, group, K, V, dtype, seed=draw(small(0, 2**16)))
    if draw(st.booleans()):  # g and beta may come in another float dtype than q
        case["g"], case["beta"] = case["g"].float(), case["beta"].float()
    N = B
    if varlen:
        bounds = random_bounds(draw, T)
        case["cu_seqlens"] = torch.tensor(bounds, dtype=draw(st.sampled_from([torch.int32, torch.int64])))
        N = len(bounds) - 1
    if draw(st.booleans()):
        case["scale"] = draw(st.floats(0.01, 2.0))
    case["use_qk_l2norm_in_kernel"] = draw(st.booleans())
    if pool:
        slots = draw(small(N, N + 3))
        indices = skip_some(draw, slots, N)
        case["ssm_pool"] = torch.randn(slots, H * group, K, V, generator=torch.Generator().manual_seed(T)) * 0.1
        case["ssm_indices"] = torch.tensor(indices, dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    else:
        case["output_final_state"] = draw(st.booleans())
        if draw(st.booleans()):
            case["initial_state"] = torch.randn(N, H * group, K, V) * 0.1
    return case


def sequences(case: dict) -> int:
    cu = case.get("cu_seqlens")
    return case["q"].shape[0] if cu is None else cu.numel() - 1


GDN_TENSORS = ("q", "k", "v", "g", "beta")
GDN_KINDS = ["resize", "ndim", "dtype", "non-tensor", "device", "heads", "cu_seqlens", "scale", "flag"]
GDN_ONLY_KINDS = ["state", "head_first"]
POOL_ONLY_KINDS = ["pool", "indices"]


def mutate_gdn(draw, case: dict, kind: str) -> set[str]:
    pool = "ssm_pool" in case
    B, T, H, _ = case["q"].shape
    if kind == "resize":
        name = pick(draw, GDN_TENSORS)
        dims = range(case[name].ndim)
        if name == "v" and not pool and "initial_state" not in case:
            dims = range(3)  # V is read from v: without a state or pool to disagree, another V is valid
        case[name] = resize_some_dim(draw, case[name], dims)
        return {"q": {"q", "k"}, "v": {"v", "g", "initial_state", "ssm_pool"}}.get(name, {name})
    if kind == "ndim":
        name = pick(draw, GDN_TENSORS)
        case[name] = other_ndim(draw, case[name])
        return {name}
    if kind == "dtype":
        name = pick(draw, GDN_TENSORS)
        t = case[name]
        if name in ("k", "v"):  # any dtype other than q's
            dtype = pick(draw, [d for d in (torch.float32, torch.bfloat16, torch.float64) if d != t.dtype])
        else:
            dtype = bad_float_dtype(draw)
        note(f"{name}: {t.dtype} -> {dtype}")
        case[name] = t.to(dtype)
        return {"q": {"q", "k"}}.get(name, {name})
    if kind == "non-tensor":
        name = pick(draw, GDN_TENSORS)
        case[name] = non_tensor(draw, case[name], optional=False)
        return {name}
    if kind == "device":
        name = pick(draw, GDN_TENSORS)
        case[name] = meta_like(case[name])
        return {"k"} if name == "q" else {name}
    if kind == "heads":  # v, g, beta and the state agree on an HV that is not a multiple of H
        HV = 0 if H == 1 else draw(small(1, 3 * H).filter(lambda hv: hv % H != 0))
        note(f"H = {H}, HV -> {HV}")
        for name, dim in (("v", 2), ("g", 2), ("beta", 2), ("initial_state", 1), ("ssm_pool", 1)):
            if name in case:
                case[name] = resized(case[name], dim, HV)
        return {"v"}
    if kind == "cu_seqlens":
        if B > 1:  # a valid cu_seqlens, but the batch is not packed
            case["cu_seqlens"] = torch.tensor(random_bounds(draw, T), dtype=torch.int32)
            return {"q"}
        bounds = case["cu_seqlens"].tolist() if "cu_seqlens" in case else [0, T]
        variant = pick(draw, ["broken", "non-tensor", "device", "other-N"])
        note(f"cu_seqlens {bounds}: {variant}")
        if variant == "broken":
            case["cu_seqlens"] = broken_offsets(draw, bounds, "cu_seqlens")
            return {"cu_seqlens"}
        if variant == "non-tensor":
            case["cu_seqlens"] = bounds
            return {"cu_seqlens"}
        if variant == "device":
            case["cu_seqlens"] = torch.empty(len(bounds), dtype=torch.int32, device="meta")
            return {"cu_seqlens"}
        # a valid cu_seqlens with another number of sequences: the state / pool indices no longer fit
        N = len(bounds) - 1
        new = draw(small(1, 5).filter(lambda n: n != N))
        case["cu_seqlens"] = torch.tensor([0] * new + [T], dtype=torch.int32)
        if not pool:
            case["initial_state"] = gdn_state(N, case)
        return {"ssm_indices" if pool else "initial_state"}
    if kind == "scale":
        case["scale"] = pick(draw, [-1.0, 0.0, -2, 0, math.nan, math.inf, -math.inf, "0.5", True, [1.0], 10**400])
        return {"scale"}
    if kind == "flag":
        flag = pick(draw, ["use_qk_l2norm_in_kernel"] + ([] if pool else ["output_final_state"]))
        case[flag] = pick(draw, [1, 0, None, "False", np.bool_(False), torch.tensor(True)])
        return {flag}
    if kind == "head_first":
        case["head_first"] = pick(draw, [True, 1, None, "BTHK"])
        return {"head_first"}
    if kind == "state":
        state = case.get("initial_state")
        if state is None:
            state = gdn_state(sequences(case), case)
        variant = pick(draw, ["resize", "ndim", "dtype", "non-tensor", "device"])
        note(f"initial_state {list(state.shape)}: {variant}")
        case["initial_state"] = {
            "resize": lambda: resize_some_dim(draw, state, range(4)),
            "ndim": lambda: other_ndim(draw, state),
            "dtype": lambda: state.to(bad_float_dtype(draw)),
            "non-tensor": lambda: non_tensor(draw, state, optional=True),
            "device": lambda: meta_like(state),
        }[variant]()
        return {"initial_state"}
    if kind == "pool":
        p = case["ssm_pool"]
        variant = pick(draw, ["dtype", "resize", "ndim", "none", "device", "empty"])
        note(f"ssm_pool {list(p.shape)}: {variant}")
        case["ssm_pool"] = {
            "dtype": lambda: p.to(pick(draw, [torch.float64, torch.int32])),
            "resize": lambda: resize_some_dim(draw, p, range(1, 4)),
            "ndim": lambda: other_ndim(draw, p),
            "none": lambda: None,
            "device": lambda: meta_like(p),
            "empty": lambda: resized(p, 0, 0),
        }[variant]()
        return {"ssm_pool"}
    assert kind == "indices", kind
    idx, slots = case["ssm_indices"], case["ssm_pool"].shape[0]
    variant = pick(draw, ["slots", "dtype", "count", "2-D", "none", "device"])
    note(f"ssm_indices {idx.tolist()} of {slots} slots: {variant}")
    case["ssm_indices"] = {
        "slots": lambda: torch.tensor(bad_slots(draw, idx.tolist(), slots), dtype=idx.dtype),
        "dtype": lambda: idx.to(pick(draw, BAD_INDEX_DTYPES)),
        "count": lambda: resized(idx, 0, changed_size(draw, idx.numel())),
        "2-D": lambda: idx[None],
        "none": lambda: None,
        "device": lambda: meta_like(idx),
    }[variant]()
    return {"ssm_indices"}


@pytest.mark.parametrize("kind", GDN_KINDS + GDN_ONLY_KINDS)
@pytest.mark.parametrize("op", GDN_OPS)
@MUTATIONS
@given(data=st.data())
def test_property_gdn_mutations_are_rejected(op, kind, data):
    case = data.draw(gdn_cases())
    blamed = mutate_gdn(data.draw, case, kind)
    assert_rejected(getattr(ops, op), case, blamed)


@pytest.mark.parametrize("op", GDN_OPS)
@VALID
@given(case=gdn_cases())
def test_property_gdn_valid_inputs_run(op, case):
    B, T, _, K = case["q"].shape
    _, _, HV, V = case["v"].shape
    o, final = getattr(ops, op)(**case)
    assert o.shape == (B, T, HV, V) and o.dtype == case["v"].dtype
    assert torch.isfinite(o).all()
    if case["output_final_state"]:
        assert final.shape == (sequences(case), HV, K, V) and final.dtype == torch.float32
        assert torch.isfinite(final).all()
    else:
        assert final is None


@pytest.mark.parametrize("kind", GDN_KINDS + POOL_ONLY_KINDS)
@MUTATIONS
@given(data=st.data())
def test_property_pool_decode_mutations_are_rejected(kind, data):
    case = data.draw(gdn_cases(pool=True))
    blamed = mutate_gdn(data.draw, case, kind)
    assert_rejected(ops.fused_recurrent_gated_delta_rule_update, case, blamed)


@VALID
@given(case=gdn_cases(pool=True))
def test_property_pool_decode_valid_inputs_run(case):
    B, T = case["q"].shape[:2]
    _, _, HV, V = case["v"].shape
    pool_before = case["ssm_pool"].clone()
    o = ops.fused_recurrent_gated_delta_rule_update(**case)
    assert o.shape == (B, T, HV, V) and o.dtype == case["v"].dtype
    assert torch.isfinite(o).all() and torch.isfinite(case["ssm_pool"]).all()
    indices = case["ssm_indices"].tolist()
    for slot in range(case["ssm_pool"].shape[0]):
        if slot not in indices:  # slots nobody points at are untouched
            assert torch.equal(case["ssm_pool"][slot], pool_before[slot])
    o_rows = o.reshape(B * T, HV, V)
    bounds = case["cu_seqlens"].tolist() if "cu_seqlens" in case else [b * T for b in range(B + 1)]
    for n, slot in enumerate(indices):
        if slot == -1:  # skipped sequences output zeros
            assert (o_rows[bounds[n] : bounds[n + 1]] == 0).all()


def test_pool_decode_with_only_empty_live_sequences_runs():
    """Regression (found by the property test): with cu_seqlens [0, 0, 1] and ssm_indices [0, -1] the
    only live sequence is empty, a valid call with nothing to do."""
    call = make_pool_call(B=1, T=1, slots=2)
    call["cu_seqlens"] = torch.tensor([0, 0, 1], dtype=torch.int32)
    call["ssm_indices"] = torch.tensor([0, -1], dtype=torch.int32)
    before = call["ssm_pool"].clone()
    o = POOL_OP(**call)
    assert (o == 0).all() and torch.equal(call["ssm_pool"], before)


# -- causal_conv1d_fn -------------------------------------------------------------------------------


@st.composite
def conv_fn_cases(draw, varlen: bool | None = None) -> dict:
    D, W = draw(small(1, 6)), draw(small(1, 4))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    case = dict(weight=torch.randn(D, W).to(dtype), activation=draw(st.sampled_from([None, "silu", "swish"])))
    if draw(st.booleans()):
        case["bias"] = torch.randn(D).to(dtype)
    if varlen is None:
        varlen = draw(st.booleans())
    if not varlen:
        B, T = draw(small(1, 3)), draw(small(1, 12))
        case["x"] = torch.randn(B, D, T).to(dtype)
        case["return_final_states"] = draw(st.booleans())
        if draw(st.booleans()):
            ids = sorted(draw(st.lists(small(0, 3), min_size=T, max_size=T)))
            case["seq_idx"] = torch.tensor([ids] * B, dtype=torch.int32)
        if draw(st.booleans()):
            case["initial_states"] = torch.randn(B, D, W - 1).to(dtype)
        return case
    T = draw(small(1, 12))
    bounds = random_bounds(draw, T)
    N = len(bounds) - 1
    case["x"] = torch.randn(D, T).to(dtype)
    case["query_start_loc"] = torch.tensor(bounds, dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    if draw(st.booleans()):
        slots = draw(small(N, N + 3))
        case["conv_states"] = torch.randn(slots, D, W - 1).to(dtype)
        if draw(st.booleans()):
            indices = skip_some(draw, slots, N)
            case["cache_indices"] = torch.tensor(indices)
        if draw(st.booleans()):
            case["has_initial_state"] = torch.tensor(draw(st.lists(st.booleans(), min_size=N, max_size=N)))
    return case


CONV_FN_KINDS = ["resize", "empty", "dtype", "non-tensor", "device", "activation", "flag", "mode"]
CONV_FN_DENSE_KINDS = ["seq_idx", "initial_states"]
CONV_FN_VARLEN_KINDS = ["query_start_loc", "conv_states", "cache_indices", "has_initial_state"]


def mutate_conv_fn(draw, case: dict, kind: str) -> set[str]:
    varlen = "query_start_loc" in case
    x = case["x"]
    D, W = case["weight"].shape
    N = case["query_start_loc"].numel() - 1 if varlen else x.shape[0]
    present = [n for n, t in case.items() if isinstance(t, torch.Tensor)]
    if kind == "resize":  # (tensor, dim) pairs that are wrong whatever the new size
        options = [("x", 0 if varlen else 1, {"x", "weight"}), ("weight", 0, {"weight"})]
        options += [("x", 1, {"x", "query_start_loc"})] if varlen else []
        options += [("bias", 0, {"bias"})] if "bias" in case else []
        name, dim, blamed = draw(st.sampled_from(options))
        case[name] = resize_some_dim(draw, case[name], [dim])
        return blamed
    if kind == "empty":  # a zero-size dimension in x or weight
        name = pick(draw, ["x", "weight"])
        case[name] = resized(case[name], draw(small(0, case[name].ndim - 1)), 0)
        return {"x", "weight"}
    if kind == "dtype":
        name = pick(draw, present)
        t = case[name]
        if name in ("seq_idx", "query_start_loc", "cache_indices"):
            dtype = pick(draw, BAD_INDEX_DTYPES)
        elif name == "has_initial_state":
            dtype = pick(draw, [torch.int32, torch.float32, torch.int64])
        else:
            dtype = bad_float_dtype(draw)
        note(f"{name}: {t.dtype} -> {dtype}")
        case[name] = t.to(dtype)
        return {name}
    if kind == "non-tensor":
        name = pick(draw, present)
        case[name] = non_tensor(draw, case[name], optional=name not in ("x", "weight"))
        return {name}
    if kind == "device":
        name = pick(draw, present)
        case[name] = meta_like(case[name])
        return {"weight"} if name == "x" else {name}
    if kind == "activation":
        case["activation"] = pick(draw, ["relu", "Silu", "", 1, True, ["silu"], np.array([0, 1])])
        return {"activation"}
    if kind == "flag":
        if varlen and draw(st.booleans()):
            case["return_final_states"] = True  # a bool, but final states go to conv_states in varlen mode
        else:
            case["return_final_states"] = pick(draw, [1, 0, None, "yes", np.bool_(True)])
        return {"return_final_states"}
    if kind == "mode":  # an argument of the other mode
        if varlen:
            name = pick(draw, ["seq_idx", "initial_states"])
            case[name] = (
                torch.zeros(1, x.shape[1], dtype=torch.int32) if name == "seq_idx" else torch.zeros(1, D, W - 1)
            )
        else:
            name = pick(draw, ["conv_states", "cache_indices", "has_initial_state"])
            case[name] = {
                "conv_states": torch.zeros(N, D, W - 1),
                "cache_indices": torch.arange(N),
                "has_initial_state": torch.zeros(N, dtype=torch.bool),
            }[name]
        return {name}
    if kind == "seq_idx":
        B, T = x.shape[0], x.shape[2]
        seq_idx = case.get("seq_idx", torch.zeros(B, T, dtype=torch.int32))
        variant = pick(draw, ["resize", "ndim", "dtype"])
        case["seq_idx"] = {
            "resize": lambda: resize_some_dim(draw, seq_idx, range(2)),
            "ndim": lambda: other_ndim(draw, seq_idx),
            "dtype": lambda: seq_idx.to(pick(draw, BAD_INDEX_DTYPES)),
        }[variant]()
        return {"seq_idx"}
    if kind == "initial_states":
        states = case.get("initial_states", torch.zeros(N, D, W - 1))
        variant = pick(draw, ["resize", "ndim", "dtype"])
        case["initial_states"] = {
            "resize": lambda: resize_some_dim(draw, states, range(3)),
            "ndim": lambda: other_ndim(draw, states),
            "dtype": lambda: states.to(bad_float_dtype(draw)),
        }[variant]()
        return {"initial_states"}
    if kind == "query_start_loc":
        case["query_start_loc"] = broken_offsets(draw, case["query_start_loc"].tolist(), "query_start_loc")
        return {"query_start_loc"}
    if kind == "conv_states":
        pool = case.get("conv_states", torch.zeros(N, D, W - 1))
        variant = pick(draw, ["resize", "ndim", "dtype", "empty", "too-few", "missing"])
        note(f"conv_states {list(pool.shape)}: {variant}")
        if variant == "too-few":  # no cache_indices: sequence n uses slot n
            case.pop("cache_indices", None)
            case["conv_states"] = resized(pool, 0, draw(small(1, N)) - 1) if N > 1 else resized(pool, 0, 0)
        elif variant == "missing":  # cache_indices or has_initial_state need a pool
            case.pop("conv_states", None)
            name = pick(draw, ["cache_indices", "has_initial_state"])
            case.setdefault(name, torch.arange(N) if name == "cache_indices" else torch.ones(N, dtype=torch.bool))
        else:
            case["conv_states"] = {
                "resize": lambda: resize_some_dim(draw, pool, [1, 2]),
                "ndim": lambda: other_ndim(draw, pool),
                "dtype": lambda: pool.to(bad_float_dtype(draw)),
                "empty": lambda: resized(pool, 0, 0),
            }[variant]()
        return {"conv_states"}
    if kind == "has_initial_state":
        case.setdefault("conv_states", torch.zeros(N, D, W - 1))
        flags = case.get("has_initial_state", torch.ones(N, dtype=torch.bool))
        variant = pick(draw, ["count", "2-D", "dtype"])
        case["has_initial_state"] = {
            "count": lambda: resized(flags, 0, changed_size(draw, N)),
            "2-D": lambda: flags[None],
            "dtype": lambda: flags.to(pick(draw, [torch.int32, torch.float32, torch.uint8])),
        }[variant]()
        return {"has_initial_state"}
    assert kind == "cache_indices", kind
    pool = case.setdefault("conv_states", torch.zeros(N, D, W - 1))
    indices = case.get("cache_indices", torch.arange(N))
    variant = pick(draw, ["slots", "count", "2-D", "dtype"])
    case["cache_indices"] = {
        "slots": lambda: torch.tensor(bad_slots(draw, indices.tolist(), pool.shape[0])),
        "count": lambda: resized(indices, 0, changed_size(draw, N)),
        "2-D": lambda: indices[None],
        "dtype": lambda: indices.to(pick(draw, BAD_INDEX_DTYPES)),
    }[variant]()
    return {"cache_indices"}


@pytest.mark.parametrize(
    ("kind", "varlen"),
    [(k, v) for k in CONV_FN_KINDS for v in (False, True)]
    + [(k, False) for k in CONV_FN_DENSE_KINDS]
    + [(k, True) for k in CONV_FN_VARLEN_KINDS],
)
@MUTATIONS
@given(data=st.data())
def test_property_conv_fn_mutations_are_rejected(kind, varlen, data):
    case = data.draw(conv_fn_cases(varlen))
    blamed = mutate_conv_fn(data.draw, case, kind)
    assert_rejected(ops.causal_conv1d_fn, case, blamed)


@VALID
@given(case=conv_fn_cases())
def test_property_conv_fn_valid_inputs_run(case):
    x = case["x"]
    D, W = case["weight"].shape
    out = ops.causal_conv1d_fn(**case)
    if case.get("return_final_states"):
        out, final = out
        assert final.shape == (x.shape[0], D, W - 1) and final.dtype == x.dtype
        assert torch.isfinite(final).all()
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.isfinite(out).all()
    if "conv_states" in case:
        assert torch.isfinite(case["conv_states"]).all()


def test_conv_fn_varlen_with_every_row_skipped_runs():
    """Regression (found by the property test): cache_indices all -1 is a valid call, nothing to write."""
    call = make_conv_varlen(lengths=(2, 3), slots=3)
    call["cache_indices"] = torch.tensor([-1, -1], dtype=torch.int32)
    before = call["conv_states"].clone()
    out = CONV_FN(**call)
    assert out.shape == (4, 5) and torch.equal(call["conv_states"], before)


# -- causal_conv1d_update ---------------------------------------------------------------------------


@st.composite
def conv_update_cases(draw) -> dict:
    B, D, W = draw(small(1, 3)), draw(small(1, 6)), draw(small(1, 4))
    state_len = draw(small(W - 1, W + 2))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    L = draw(st.one_of(st.none(), small(1, 4)))
    case = dict(
        x=(torch.randn(B, D) if L is None else torch.randn(B, D, L)).to(dtype),
        weight=torch.randn(D, W).to(dtype),
        activation=draw(st.sampled_from([None, "silu", "swish"])),
    )
    if draw(st.booleans()):
        case["bias"] = torch.randn(D).to(dtype)
    slots = B
    if draw(st.booleans()):
        slots = draw(small(B, B + 3))
        case["conv_state_indices"] = torch.tensor(
            skip_some(draw, slots, B), dtype=draw(st.sampled_from([torch.int32, torch.int64]))
        )
    case["conv_state"] = torch.randn(slots, D, state_len).to(dtype)
    return case


CONV_UPDATE_KINDS = [
    "resize",
    "ndim",
    "dtype",
    "non-tensor",
    "device",
    "activation",
    "short-state",
    "rows",
    "indices",
]


def mutate_conv_update(draw, case: dict, kind: str) -> set[str]:
    x, state = case["x"], case["conv_state"]
    B, D = x.shape[:2]
    present = [n for n, t in case.items() if isinstance(t, torch.Tensor)]
    if kind == "resize":  # (tensor, dim) pairs that are wrong whatever the new size
        options = [("x", 1, {"x", "weight"}), ("weight", 0, {"weight"}), ("conv_state", 1, {"conv_state"})]
        options += [("bias", 0, {"bias"})] if "bias" in case else []
        name, dim, blamed = draw(st.sampled_from(options))
        case[name] = resize_some_dim(draw, case[name], [dim])
        return blamed
    if kind == "ndim":
        name = pick(draw, ["x", "conv_state", "weight"])
        t = case[name]
        if name == "x":
            case[name] = t.reshape(-1) if draw(st.booleans()) else t.reshape(*t.shape, *([1] * (4 - t.ndim)))
        else:
            case[name] = other_ndim(draw, t)
        return {name}
    if kind == "dtype":
        name = pick(draw, present)
        t = case[name]
        case[name] = t.to(pick(draw, BAD_INDEX_DTYPES) if name == "conv_state_indices" else bad_float_dtype(draw))
        return {name}
    if kind == "non-tensor":
        name = pick(draw, present)
        case[name] = non_tensor(draw, case[name], optional=name in ("bias", "conv_state_indices"))
        return {name}
    if kind == "device":
        name = pick(draw, present)
        case[name] = meta_like(case[name])
        return {"conv_state"} if name == "x" else {name}
    if kind == "activation":
        case["activation"] = pick(draw, ["gelu", "SILU", 0, False, ("silu",)])
        return {"activation"}
    if kind == "short-state":  # a kernel wider than the state can feed: state_len < W - 1
        width = state.shape[2] + 2 + draw(small(0, 2))
        case["weight"] = torch.randn(D, width)
        case.pop("bias", None)
        return {"conv_state"}
    if kind == "rows":  # no indices, and a pool whose row count is not B
        case.pop("conv_state_indices", None)
        case["conv_state"] = resized(state, 0, changed_size(draw, B))
        return {"conv_state"}
    assert kind == "indices", kind
    indices = case.get("conv_state_indices", torch.arange(B))
    variant = pick(draw, ["slots", "count", "2-D"])
    case["conv_state_indices"] = {
        "slots": lambda: torch.tensor(bad_slots(draw, indices.tolist(), state.shape[0])),
        "count": lambda: resized(indices, 0, changed_size(draw, B)),
        "2-D": lambda: indices[None],
    }[variant]()
    return {"conv_state_indices"}


@pytest.mark.parametrize("kind", CONV_UPDATE_KINDS)
@MUTATIONS
@given(data=st.data())
def test_property_conv_update_mutations_are_rejected(kind, data):
    case = data.draw(conv_update_cases())
    blamed = mutate_conv_update(data.draw, case, kind)
    assert_rejected(ops.causal_conv1d_update, case, blamed)


@VALID
@given(case=conv_update_cases())
def test_property_conv_update_valid_inputs_run(case):
    before = case["conv_state"].clone()
    out = ops.causal_conv1d_update(**case)
    assert out.shape == case["x"].shape and out.dtype == case["x"].dtype
    assert torch.isfinite(out).all() and torch.isfinite(case["conv_state"]).all()
    indices = case.get("conv_state_indices")
    if indices is not None:
        for row, slot in enumerate(indices.tolist()):
            if slot == -1:  # skipped rows output zeros
                assert (out[row] == 0).all()
        for slot in range(before.shape[0]):
            if slot not in indices.tolist():  # and no pool row is touched but the live ones
                assert torch.equal(case["conv_state"][slot], before[slot])


def test_conv_update_kernel_width_one_with_empty_state_runs():
    """Regression (found by the property test): W = 1 needs no history, so conv_state [slots, D, 0] is
    valid and must stay empty."""
    call = make_conv_update(B=2, D=4, W=1, state_len=0, slots=2)
    call["conv_state_indices"] = None
    out = CONV_UPDATE(**call)
    expected = call["x"] * call["weight"][:, 0] + call["bias"]
    torch.testing.assert_close(out, expected)


# -- l2norm -----------------------------------------------------------------------------------------


@st.composite
def l2norm_cases(draw) -> dict:
    shape = draw(st.lists(small(1, 5), min_size=1, max_size=4))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    case = dict(x=torch.randn(shape).to(dtype))
    if draw(st.booleans()):
        case["eps"] = draw(st.one_of(st.floats(1e-12, 1.0), small(1, 3)))
    return case


L2NORM_KINDS = ["dtype", "non-tensor", "0-D", "empty-last", "eps-value", "eps-type"]


def mutate_l2norm(draw, case: dict, kind: str) -> set[str]:
    x = case["x"]
    if kind == "eps-value":
        case["eps"] = draw(st.one_of(st.floats(max_value=0.0), st.sampled_from([math.nan, math.inf, 10**400, 0, -1])))
        return {"eps"}
    if kind == "eps-type":
        case["eps"] = pick(draw, ["1e-6", None, True, torch.tensor(1e-6), [1e-6], np.array(1e-6)])
        return {"eps"}
    case["x"] = {
        "dtype": lambda: x.to(bad_float_dtype(draw)),
        "non-tensor": lambda: non_tensor(draw, x, optional=False),
        "0-D": lambda: x.reshape(-1)[0],
        "empty-last": lambda: resized(x, x.ndim - 1, 0),
    }[kind]()
    return {"x"}


@pytest.mark.parametrize("kind", L2NORM_KINDS)
@MUTATIONS
@given(data=st.data())
def test_property_l2norm_mutations_are_rejected(kind, data):
    case = data.draw(l2norm_cases())
    blamed = mutate_l2norm(data.draw, case, kind)
    assert_rejected(ops.l2norm, case, blamed)


@VALID
@given(case=l2norm_cases())
def test_property_l2norm_valid_inputs_run(case):
    out = ops.l2norm(**case)
    assert out.shape == case["x"].shape and out.dtype == case["x"].dtype
    assert torch.isfinite(out).all()
    assert (out.float().norm(dim=-1) <= 1.01).all()


# -- fused_gdn_gating -------------------------------------------------------------------------------


@st.composite
def gating_cases(draw) -> dict:
    lead = draw(st.lists(small(1, 4), min_size=0, max_size=3))
    HV = draw(small(1, 8))
    case = make_gating(lead=tuple(lead), HV=HV)
    if draw(st.booleans()):
        dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
        case = {n: t.to(dtype) for n, t in case.items()}
    return case


GATING_KINDS = ["resize", "ndim", "dtype", "non-tensor", "device"]


def mutate_gating(draw, case: dict, kind: str) -> set[str]:
    name = pick(draw, ["A_log", "a", "b", "dt_bias"])
    t = case[name]
    note(f"{kind} of {name} {list(t.shape)}")
    if kind == "resize":
        dim = draw(small(0, t.ndim - 1))
        case[name] = resize_some_dim(draw, t, [dim])
        if name == "a":  # the last dim disagrees with HV; a leading dim with b
            return {"a"} if dim == t.ndim - 1 else {"b"}
        return {"A_log": {"A_log", "dt_bias"}}.get(name, {name})
    if kind == "ndim":
        if draw(st.booleans()):
            case[name] = t.unsqueeze(0)
            return {"b"} if name == "a" else {name}  # a [1, ..., HV] is a fine a, but b no longer matches
        case[name] = t.reshape(-1)[0]  # 0-D
        return {name}
    if kind == "dtype":
        case[name] = t.to(bad_float_dtype(draw))
        return {name}
    if kind == "non-tensor":
        case[name] = non_tensor(draw, t, optional=False)
        return {name}
    assert kind == "device", kind
    case[name] = meta_like(t)
    return {"a"} if name == "A_log" else {name}


@pytest.mark.parametrize("kind", GATING_KINDS)
@MUTATIONS
@given(data=st.data())
def test_property_gating_mutations_are_rejected(kind, data):
    case = data.draw(gating_cases())
    blamed = mutate_gating(data.draw, case, kind)
    assert_rejected(ops.fused_gdn_gating, case, blamed)


@VALID
@given(case=gating_cases())
def test_property_gating_valid_inputs_run(case):
    g, beta = ops.fused_gdn_gating(**case)
    assert g.shape == case["a"].shape and g.dtype == torch.float32
    assert beta.shape == case["b"].shape and beta.dtype == case["b"].dtype
    assert torch.isfinite(g).all() and (g <= 0).all()
    assert torch.isfinite(beta).all() and ((beta >= 0) & (beta <= 1)).all()


# ---------------------------------------------------------------------------------------------------
# Each distinct signature is checked once; the value checks run on every call's own tensors.


@pytest.fixture
def counted_checks(monkeypatch):
    """How many shape checks ran, from a clean slate of accepted signatures."""
    from gdn import _validate

    for check in (_validate.check_gdn_inputs, _validate.check_pool_decode_inputs):
        check.cache_clear()
    counted = []
    original = _validate.Checker.shape

    def shape(self, name, *args):
        counted.append(name)
        return original(self, name, *args)

    monkeypatch.setattr(_validate.Checker, "shape", shape)
    return counted


def test_a_repeated_signature_is_not_checked_again_but_its_values_are(counted_checks):
    POOL_OP(**make_pool_call(B=3, slots=5, K=5, V=6))
    first = len(counted_checks)
    assert first > 0
    POOL_OP(**make_pool_call(B=3, slots=5, K=5, V=6, seed=1))  # same shapes, dtypes, devices: accepted before
    assert len(counted_checks) == first
    call = make_pool_call(B=3, slots=5, K=5, V=6, seed=2)
    call["ssm_indices"] = torch.tensor([4, 0, 4], dtype=torch.int32)
    with rejects(ValueError, "ssm_indices", "distinct live slots", "ssm_indices[0] = ssm_indices[2] = 4"):
        POOL_OP(**call)
    POOL_OP(**make_pool_call(B=3, slots=6, K=5, V=6))  # another pool size: a new signature, checked in full
    assert len(counted_checks) > first


def test_a_repeated_signature_still_checks_the_offsets_its_inner_check_registered(counted_checks):
    def call(bounds):
        args = make_pool_call(B=1, T=4, slots=4, K=5)
        return dict(args, cu_seqlens=torch.tensor(bounds), ssm_indices=torch.tensor([0, 1, 2], dtype=torch.int32))

    POOL_OP(**call([0, 1, 3, 4]))
    first = len(counted_checks)
    with rejects(ValueError, "cu_seqlens", "non-decreasing offsets"):
        POOL_OP(**call([0, 3, 1, 4]))
    assert len(counted_checks) == first  # the metadata checks did not run again: the offsets' check did


def test_a_call_on_another_device_is_a_new_signature(counted_checks):
    POOL_OP(**make_pool_call(K=5))
    call = make_pool_call(K=5)
    call["ssm_pool"] = meta_like(call["ssm_pool"])
    with rejects(ValueError, "ssm_pool", "same as 'q'", "got device meta"):
        POOL_OP(**call)


def test_a_remembered_signature_keeps_no_tensor_of_its_call_alive(counted_checks):
    """The memory holds what the checks read, never the tensors: a serving loop's inputs of every step
    must be freed as before."""
    import gc
    import weakref

    call = make_pool_call(B=1, T=3, slots=2, K=5)
    call["cu_seqlens"] = torch.tensor([0, 3])
    refs = [weakref.ref(t) for t in call.values()]
    POOL_OP(**call)
    del call
    gc.collect()
    assert all(ref() is None for ref in refs)
