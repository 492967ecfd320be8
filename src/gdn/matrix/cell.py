"""Run one cell end to end, in a container or on the host, and leave results/<cell>/ whatever happens.

A cell that cannot run here (no NPU, no GPU, no docker engine), fails to build, crashes or times out
still gets a cell.json saying so, with the log tail. Results are staged in a private directory and
moved into place in one rename, so a cell never leaves half a result and never touches another's.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from gdn.matrix.config import Cell, Matrix, MatrixConfigError, cell_files
from gdn.matrix.lock import lock_summary
from gdn.matrix.results import CellOutcome

LOG_TAIL_LINES = 60
CONTAINER_SOURCE = Path("/src")
CONTAINER_RESULTS = Path("/results")
NPU_MARKER = Path("/dev/davinci_manager")
CUDA_MARKER = Path("/dev/nvidiactl")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class CellLog:
    """Everything the cell prints: echoed, kept whole in log.txt and as a tail for cell.json."""

    def __init__(self, path: Path, echo: Callable[[str], None]):
        self.handle = path.open("w")
        self.tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.echo = echo

    def __call__(self, line: str) -> None:
        line = line.rstrip("\n")
        self.handle.write(line + "\n")
        self.handle.flush()
        self.tail.append(line)
        self.echo(line)

    def text(self) -> str:
        return "\n".join(self.tail)

    def close(self) -> None:
        self.handle.close()


def device_absent_reason(cell: Cell, host_root: Path = Path("/")) -> str | None:
    if cell.device == "npu" and not (host_root / NPU_MARKER.relative_to("/")).exists():
        return f"no Ascend NPU on this machine ({NPU_MARKER} is absent); npu cells run on Ascend runners"
    if cell.device == "cuda" and not (host_root / CUDA_MARKER.relative_to("/")).exists():
        return f"no NVIDIA GPU on this machine ({CUDA_MARKER} is absent); cuda cells run on GPU runners"
    return None


def entry_command(cell: Cell, out: Path, source: Path, python: str = "python") -> list[str]:
    command = [python, "-m", "gdn.matrix.entry", "--cell", cell.name, "--out", str(out)]
    command += ["--families", ",".join(cell.families), "--mode", cell.compute_mode, "--tests", str(source / "tests")]
    return command + (["--bench"] if cell.bench else [])


def status_of(exit_code: int | None) -> str:
    return {0: "passed", 1: "failed"}.get(exit_code, "error")


def _run_host(cell: Cell, root: Path, out: Path, log: CellLog) -> tuple[int | None, bool]:
    """The same entry as in a container, in this Python environment; returns (exit code, timed out)."""
    env_cmd = entry_command(cell, out, root, python=sys.executable)
    process = subprocess.Popen(
        env_cmd,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env={**os.environ, **cell.env},
    )
    reader = threading.Thread(target=lambda: [log(line) for line in process.stdout], daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=cell.timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        reader.join(timeout=5)
        return None, True
    reader.join()
    return code, False


def _run_docker(matrix: Matrix, cell: Cell, root: Path, out: Path, log: CellLog, outcome: CellOutcome) -> None:
    from gdn.matrix import images

    client, reason = images.docker_client()
    if client is None:
        outcome.status, outcome.reason = "not_run", f"{reason}; run `nox -s local` for the host cell"
        return
    try:
        files = cell_files(matrix, cell, root)
    except MatrixConfigError as exc:
        outcome.status, outcome.reason = "error", str(exc)
        return
    try:
        build = images.build_image(client, cell, files, root, log=log)
    except images.ImageBuildError as exc:
        outcome.status, outcome.reason, outcome.log_tail = "build_failed", f"image build failed: {exc}", exc.log_tail
        return
    outcome.image, outcome.image_built = build.tag, build.built
    outcome.real_hardware = True  # the device check passed: from here on it runs on the real device kind
    result = images.run_container(
        client,
        cell,
        build.tag,
        root=root,
        out_dir=out,
        command=entry_command(cell, CONTAINER_RESULTS, CONTAINER_SOURCE),
        log=log,
    )
    outcome.exit_code = result.exit_code
    if result.timed_out:
        outcome.status, outcome.reason = "timeout", f"the container ran past timeout_s={cell.timeout_s}"
    else:
        outcome.status = status_of(result.exit_code)
        if outcome.status == "error":
            outcome.reason = f"the container exited with status {result.exit_code}"


def stand_in_labels(manifest_path: Path) -> list[str]:
    """The stand-in modules the cell's probe found (tests/standins): results produced with them are
    not results of real wheels, and the report says so."""
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return []
    return sorted({s["stand_in"] for s in manifest.values() if isinstance(s, dict) and s.get("stand_in")})


def _publish(staging: Path, final: Path) -> None:
    """Swap the staged directory into place: the old results go only once the new ones are complete."""
    trash = final.with_name(f".old-{final.name}-{time.monotonic_ns()}")
    if final.exists():
        final.rename(trash)
    staging.rename(final)
    shutil.rmtree(trash, ignore_errors=True)


def run_cell(
    matrix: Matrix,
    cell: Cell,
    root: Path,
    results_root: Path,
    *,
    echo: Callable[[str], None] = print,
    host_root: Path = Path("/"),
) -> CellOutcome:
    results_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=results_root, prefix=f".staging-{cell.name}-"))
    staging.chmod(0o777)  # a container runs as its own non-root user and writes here
    outcome = CellOutcome(
        cell=cell.name,
        status="error",
        device=cell.device,
        runtime=cell.runtime,
        started_at=_now(),
        families=list(cell.families),
    )
    started = time.monotonic()
    log = CellLog(staging / "log.txt", echo)
    try:
        outcome.lock = lock_summary(matrix, cell, root)
        absent = device_absent_reason(cell, host_root)
        if absent:
            outcome.status, outcome.reason = "not_run", absent
        elif cell.runtime == "host":
            outcome.real_hardware = True
            code, timed_out = _run_host(cell, root, staging, log)
            outcome.exit_code = code
            if timed_out:
                outcome.status, outcome.reason = "timeout", f"the cell ran past timeout_s={cell.timeout_s}"
            else:
                outcome.status = status_of(code)
                if outcome.status == "error":
                    outcome.reason = f"the cell entry exited with status {code}"
        else:
            _run_docker(matrix, cell, root, staging, log, outcome)
    except Exception as exc:  # the outcome must be written even when the runner itself breaks
        outcome.status, outcome.reason = "error", f"runner error: {type(exc).__name__}: {exc}"
    finally:
        log.close()
        outcome.finished_at = _now()
        outcome.duration_s = round(time.monotonic() - started, 2)
        outcome.log_tail = outcome.log_tail or log.text() or None
        outcome.stand_ins = stand_in_labels(staging / "manifest.json")
        outcome.write(staging)
        _publish(staging, results_root / cell.name)
    return outcome
