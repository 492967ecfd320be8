"""FSDP test: ranks started by torchrun shard the patched tiny Qwen3.5 actor and reference with FSDP2
and take one GRPO step, each on its own prompt groups; together they must reproduce the step of one
process on one device, and every rank's patch record must show every GDN module of both models served
by the mode under test.

Two variants share the worker (tests/grpo/fsdp_worker.py): two CPU ranks over gloo in eager mode, and
one rank per visible CUDA GPU over NCCL in triton mode (world size 1 on a one-GPU machine). Different
batch shapes per rank and the reduce-scatter's summation order differ from one process by fp32 rounding
only (measured on the CPU: 8e-7 in the whole update, 4e-6 in one tensor's), so the step's scalars, the
per-token quantities and the whole update are held to 1e-5, a single tensor's update to the
cancellation floor of grpo.compare."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import gdn
from grpo import launch
from grpo.backends import describe, not_compared, resolve_under, unserved_modules
from grpo.compare import TENSOR_FLOOR, Tolerance, differences
from grpo.rollout import Rollout
from grpo.run import Run, run
from grpo.step import StepResult, on_host
from repo_paths import TESTS

pytest.importorskip("transformers", reason="the grpo family runs transformers' Qwen3.5 models")
pytestmark = pytest.mark.grpo

WORKER = TESTS / "grpo" / "fsdp_worker.py"
SHARDED = Tolerance(forward=1e-5, gradient=1e-5, tensor=TENSOR_FLOOR)
CPU_RANKS = 2
# The GPU ranks compile the triton kernels (and probe them) on their first calls.
TIMEOUT_S = {"gloo": 120, "nccl": 150}


def _needs_fsdp2() -> None:
    if not hasattr(pytest.importorskip("torch.distributed.fsdp"), "fully_shard"):
        pytest.skip(f"torch {torch.__version__} has no FSDP2 fully_shard")


def _sharded_matches_one_process(tmp_path: Path, backend: str, mode: str, dev: torch.device, ranks: int) -> None:
    resolutions = resolve_under(mode, dev)
    print(f"{mode} on {dev.type}; the ops resolved to:", *(f"  {line}" for line in describe(resolutions)), sep="\n")
    fell_back = [op for op, res in resolutions.items() if res.backend != mode]
    assert not fell_back, f"{mode} must serve every op of the step on {dev.type}; fell back: {fell_back}"
    out = tmp_path / "fsdp.pt"
    status, output = launch.run(ranks, [str(WORKER), str(out), backend, mode], TIMEOUT_S[backend])
    if status is None:
        pytest.fail(f"the FSDP ranks did not finish within {TIMEOUT_S[backend]} s:\n{output[-6000:]}")
    assert status == 0, output[-6000:]
    saved = torch.load(out, weights_only=True)
    got = Run(Rollout(**saved["rollout"]), StepResult(**saved["step"]), None, {})
    assert len(saved["ranks"]) == ranks
    for rank, served in enumerate(saved["ranks"]):
        calls = {m["id"]: m["calls"] for m in served["record"]["modules"]}
        routes = {model: [calls.get(i) for i in ids] for model, ids in served["models"].items()}
        print(f"rank {rank}: calls per op and route of each GDN module: {routes}")
        problems = unserved_modules(dataclasses.replace(got, **served), resolutions)
        assert problems == [], f"rank {rank}: every GDN module of both sharded models must run on {mode}: {problems}"
    want = run("dense", "padded", mode, dev)
    want = dataclasses.replace(want, step=on_host(want.step))
    lines, bad = differences(got, want, SHARDED)
    title = f"{ranks} FSDP ranks ({backend}) vs 1 process ({mode} on {dev.type}):"
    print(title, *(f"  {line}" for line in lines), sep="\n")
    assert not bad, bad


def test_fsdp_ranks_on_the_host_match_one_process(tmp_path):
    """Two CPU ranks over gloo, eager."""
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch has no gloo backend")
    _needs_fsdp2()
    _sharded_matches_one_process(tmp_path, "gloo", gdn.resolve.EAGER, torch.device("cpu"), CPU_RANKS)


def test_fsdp_ranks_on_gpus_match_one_gpu(tmp_path, record_property):
    """One rank per visible CUDA GPU over NCCL, triton, against the same step on one GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA GPUs (NCCL)")
    if not (dist.is_available() and dist.is_nccl_available()):
        pytest.skip(f"torch {torch.__version__} has no NCCL backend")
    _needs_fsdp2()
    reason = gdn.resolve.backends()["triton"].why_unavailable("cuda")
    if reason:
        not_compared("triton", f"backend triton is unavailable on cuda: {reason}")
    world = torch.cuda.device_count()
    print(f"world size {world} (one rank per visible GPU)")
    record_property("world_size", world)
    _sharded_matches_one_process(tmp_path, "nccl", "triton", torch.device("cuda"), world)
