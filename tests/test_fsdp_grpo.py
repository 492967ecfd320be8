"""FSDP smoke test: two CPU ranks (gloo, torchrun) shard the patched tiny Qwen3.5 actor and reference
with FSDP2 and take one GRPO step, each on its own prompt group; together they must reproduce the
single-process step. Different batch shapes per rank and the reduce-scatter's summation order differ
from one process by fp32 rounding only, so the eager-vs-transformers tolerances apply."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gdn
from grpo.compare import Tolerance, differences
from grpo.rollout import Rollout
from grpo.run import Run, run
from grpo.step import StepResult

pytest.importorskip("transformers", reason="the grpo family runs transformers' Qwen3.5 models")
pytestmark = pytest.mark.grpo

WORKER = Path(__file__).parent / "grpo" / "fsdp_worker.py"
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launch(out: Path) -> subprocess.CompletedProcess:
    paths = [str(Path(gdn.__file__).parents[1]), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        # loopback rendezvous and transport: a matrix cell's container has no network, and its
        # hostname may not resolve
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={_free_port()}",
        "--nproc-per-node=2",
        str(WORKER),
        str(out),
    ]
    # Its own session, so that a hang is ended with every rank it started, not just the launcher.
    proc = subprocess.Popen(
        command,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths), "GLOO_SOCKET_IFNAME": "lo"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the FSDP ranks did not finish within {TIMEOUT_S} s:\n{output[-6000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, output)


def test_two_fsdp_ranks_match_one_process(tmp_path):
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("this torch has no gloo backend")
    if not hasattr(pytest.importorskip("torch.distributed.fsdp"), "fully_shard"):
        pytest.skip(f"torch {torch.__version__} has no FSDP2 fully_shard")
    out = tmp_path / "fsdp.pt"
    done = _launch(out)
    assert done.returncode == 0, done.stdout[-6000:]
    saved = torch.load(out, weights_only=True)
    assert saved["problems"] == [], "every GDN module of both sharded models must run through gdn"
    got = Run(Rollout(**saved["rollout"]), StepResult(**saved["step"]), None, {})
    want = run("dense", "padded", "eager", torch.device("cpu"))
    lines, bad = differences(got, want, Tolerance.for_backends({}))
    print("2 FSDP ranks vs 1 process (eager):", *(f"  {line}" for line in lines), sep="\n")
    assert not bad, bad
