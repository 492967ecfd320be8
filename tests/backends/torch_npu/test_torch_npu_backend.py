"""The `torch_npu` peer backend: torch_npu's fused CANN chunk op (what vllm-ascend's prefill runs), its
contract as data, gdn's call turned into the op's layout, the calls the op cannot take refused on record
and served by the next candidate.

There is no NPU here: each case runs in a child process that sees the labelled STAND-IN torch_npu of
tests/standins/site, whose npu_chunk_gated_delta_rule checks every argument against the same contract
(tests/standins/fused_chunk.py) and computes with gdn's eager op, returning bf16 as the real op does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from gdn.backends import torch_npu_chunk
from gdn.gates import GATE_FLOOR
from standins import harness

pytestmark = pytest.mark.single_op

CHILD = """
    import json, torch, gdn
    import gdn.resolve as resolver
    import torch_npu
    from gdn.matrix.kernels import kernel_records, recording

    gen = torch.Generator().manual_seed(5)

    def inputs(dtype=torch.bfloat16, state_dtype=torch.bfloat16, N=2, cu=None, grad=False, K=128):
        T = 100 if cu is None else cu[-1]
        B = N if cu is None else 1
        q, k = (torch.randn(B, T, 2, K, generator=gen).to(dtype) for _ in range(2))
        v = torch.randn(B, T, 4, 128, generator=gen).to(dtype)
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, 4, generator=gen))
        beta = torch.sigmoid(torch.randn(B, T, 4, generator=gen)).to(dtype)
        h0 = torch.randn(N, 4, K, 128, generator=gen).to(state_dtype)
        if grad:
            q.requires_grad_()
        kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        if cu is not None:
            kw["cu_seqlens"] = torch.tensor(cu)
        return (q, k, v, g, beta), kw

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    found = {}
    with resolver.compute_mode_override("torch_npu"), recording() as log:
        for name, cu in (("dense", None), ("packed", [0, 1, 64, 130])):
            args, kw = inputs(cu=cu, N=2 if cu is None else 3)
            o, final = gdn.chunk_gated_delta_rule(*args, **kw)
            route = resolver.last_route()
            with resolver.compute_mode_override("eager"):
                o_ref, final_ref = gdn.chunk_gated_delta_rule(*args, **kw)
            call = torch_npu.CALLS[-1]
            found[name] = {
                "route": route,
                "o": rel(o, o_ref),
                "final": rel(final, final_ref),
                "final_dtype": str(final.dtype),
                "query_shape": list(call["query"].shape),
                "state_shape": list(call["initial_state"].shape),
                "lengths": call["actual_seq_lengths"].tolist(),
                "query_norm": call["query"].float().norm(dim=-1).mean().item(),
                "g_dtype": str(call["g"].dtype),
            }
        # complete decay (g = -inf) mid-chunk and on a chunk's last token: the recurrence's answer
        args, kw = inputs()
        args[3][:, [5, 63]] = float("-inf")
        o, final = gdn.chunk_gated_delta_rule(*args, **kw)
        found["complete_decay_route"] = resolver.last_route()
        found["complete_decay_lowest_gate"] = torch_npu.CALLS[-1]["g"].min().item()
        with resolver.compute_mode_override("eager"):
            o_ref, final_ref = gdn.chunk_gated_delta_rule(*args, **kw)
        found["complete_decay"] = [rel(o, o_ref), rel(final, final_ref)]
        calls_before = len(torch_npu.CALLS)
        for name, kwargs in (
            ("fp32_state", dict(state_dtype=torch.float32)),
            ("fp32_inputs", dict(dtype=torch.float32, state_dtype=torch.float32)),
            ("grad", dict(grad=True)),
        ):
            args, kw = inputs(**kwargs)
            gdn.chunk_gated_delta_rule(*args, **kw)
            found[name] = {"route": resolver.last_route()}
        found["stand_in_calls_for_refused"] = len(torch_npu.CALLS) - calls_before
        [record] = [
            r for r in gdn.resolutions() if r["op"] == "chunk_gated_delta_rule" and r["requested_mode"] == "torch_npu"
        ]
        found["refusals"] = record["refusals"]
        found["kernels"] = kernel_records(log.mark())
    print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    env = harness.environment(tmp_path_factory.mktemp("npu"), None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("layout", ["dense", "packed"])
def test_bf16_calls_run_the_fused_op_in_its_layout(child, layout):
    found = child[layout]
    assert found["route"] == "torch_npu:2.10.0.post4+standin"
    assert found["o"] < 2e-2 and found["final"] < 2e-2
    assert found["final_dtype"] == "torch.float32"  # gdn's contract: the final state in fp32
    T = 200 if layout == "dense" else 130
    assert found["query_shape"] == [T, 2, 128]  # packed TND
    assert found["state_shape"] == [2 if layout == "dense" else 3, 4, 128, 128]
    assert found["lengths"] == ([100, 100] if layout == "dense" else [1, 63, 66])
    assert found["query_norm"] == pytest.approx(1.0, abs=1e-2)  # l2-normalised before the op, as vllm-ascend does
    assert found["g_dtype"] == "torch.float32"


def test_complete_decay_reaches_the_op_floored_and_gives_the_recurrences_answer(child):
    """The op chunks the sequence and takes differences of cumulative gates, where -inf - -inf is NaN:
    the adapter hands it gdn's floor instead (the stand-in computes with eager, which floors itself, so
    what the op was handed is what tells)."""
    assert child["complete_decay_route"].startswith("torch_npu:")
    assert child["complete_decay_lowest_gate"] == GATE_FLOOR
    assert max(child["complete_decay"]) < 2e-2  # within bf16 rounding of eager


def test_what_the_op_cannot_take_is_refused_on_record_and_runs_eager(child):
    assert child["fp32_state"]["route"] == "eager"
    assert child["fp32_inputs"]["route"] == "eager"
    assert child["grad"]["route"] == "eager"  # the op has no backward
    assert child["stand_in_calls_for_refused"] == 0
    reasons = {r["reason"]: r["count"] for r in child["refusals"]}
    assert reasons == {
        "torch_npu.npu_chunk_gated_delta_rule takes a bfloat16 initial state (vllm-ascend rounds its fp32 state "
        "to bf16 first); got float32": 1,
        "torch_npu.npu_chunk_gated_delta_rule takes bfloat16 q, k, v; got q float32, k float32, v float32": 1,
    }


def test_the_kernel_log_names_the_fused_op_and_what_refused_it(child):
    ran = {(r["dtype"], r["ran"], tuple(p["backend"] for p in r["passed_over"])) for r in child["kernels"]}
    assert ("bfloat16", "torch_npu:2.10.0.post4+standin", ()) in ran
    assert ("bfloat16", "eager", ("torch_npu",)) in ran  # the fp32 state, and the call that needs gradients
    assert ("float32", "eager", ("torch_npu",)) in ran


def test_the_contract_names_its_sources_and_the_op_limits():
    contract = torch_npu_chunk.CONTRACT
    assert contract.function == "npu_chunk_gated_delta_rule"
    assert any("op-plugin@" in s for s in contract.sources) and any("vllm-ascend@" in s for s in contract.sources)
    assert contract.layouts["initial_state"] == "N HV V K"  # value-first, unlike gdn's [N, HV, K, V]
    assert contract.head_dims == (128, 128) and contract.max_heads == 64


def test_the_stand_in_refuses_what_the_contract_refuses():
    import torch

    from standins.fused_chunk import ContractError, run_fused_chunk

    q = torch.randn(10, 2, 128).bfloat16()
    v = torch.randn(10, 4, 128).bfloat16()
    beta = torch.rand(10, 4).bfloat16()
    g = -torch.rand(10, 4)
    state = torch.zeros(1, 4, 128, 128, dtype=torch.bfloat16)
    lengths = torch.tensor([10], dtype=torch.int32)
    with pytest.raises(ContractError, match=r"initial_state: expected dtype torch\.bfloat16"):
        run_fused_chunk(q, q, v, beta, state.float(), lengths, 0.1, g)
    with pytest.raises(ContractError, match="scale cannot be empty"):
        run_fused_chunk(q, q, v, beta, state, lengths, None, g)
    with pytest.raises(ContractError, match="actual_seq_lengths sum to 9"):
        run_fused_chunk(q, q, v, beta, state, lengths - 1, 0.1, g)
