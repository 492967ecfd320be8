"""Starting ranks on this host with torchrun (the FSDP test and bench/fsdp_grpo.py): the command line
and the environment every rank gets."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import gdn
from repo_paths import TESTS


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _command(ranks: int, target: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        # loopback rendezvous and transport: a matrix cell's container has no network, and its
        # hostname may not resolve
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={_free_port()}",
        f"--nproc-per-node={ranks}",
        *target,
    ]


def _environment() -> dict[str, str]:
    """This process's environment, with gdn, the repository and the test helpers importable, the
    collectives' sockets on loopback, and NVLink multicast off: on a host whose GPUs others share, a
    program that uses it can put those GPUs out of service for a day or more."""
    paths = [str(Path(gdn.__file__).parents[1]), str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "lo",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }


def run(ranks: int, target: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Start `ranks` processes of `target` (a script and its arguments, or -m module ...) and wait:
    (the launcher's exit status, or None when the ranks were killed at the timeout; their output)."""
    # Its own session, so that a hang is ended with every rank it started, not just the launcher.
    proc = subprocess.Popen(
        _command(ranks, target),
        env=_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output
    return proc.returncode, output
