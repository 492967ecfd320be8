"""Run one cell end to end, in a container or on the host, and leave results/<cell>/ whatever happens.

A cell that cannot run here (no NPU, no GPU, no docker engine), fails to build, crashes or times out
still gets a cell.json saying so, with the log tail. Results are staged in a private directory and
moved into place in one rename, so a cell never leaves half a result and never touches another's.

Any cell can run in the host runtime (a docker cell on a GPU box without docker): it then runs in this
Python environment, not its image, and cell.json says so, with every pin the environment does not have.
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

from gdn.matrix import devices
from gdn.matrix.config import Cell, Matrix, MatrixConfigError, Runtime, cell_files
from gdn.matrix.lock import lock_summary
from gdn.matrix.results import CellOutcome, PinDifference
from gdn.matrix.versions import pin_differences

LOG_TAIL_LINES = 60
CONTAINER_SOURCE = Path("/src")
CONTAINER_RESULTS = Path("/results")


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


def entry_command(cell: Cell, out: Path, source: Path, python: str = "python") -> list[str]:
    command = [python, "-m", "gdn.matrix.entry", "--cell", cell.name, "--out", str(out)]
    command += ["--families", ",".join(cell.families), "--mode", cell.compute_mode, "--tests", str(source / "tests")]
    return command + (["--bench"] if cell.bench else [])


def status_of(exit_code: int | None) -> str:
    return {0: "passed", 1: "failed"}.get(exit_code, "error")


def _run_host(cell: Cell, root: Path, out: Path, log: CellLog) -> tuple[int | None, bool]:
    """The same entry as in a container, in this Python environment; returns (exit code, timed out).
    The checkout's source comes first on the path, as in a container: the interpreter (nox's own, for
    a docker cell's session) need not have gdn installed."""
    env_cmd = entry_command(cell, out, root, python=sys.executable)
    path = os.pathsep.join(p for p in (str(root / "src"), os.environ.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        env_cmd,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env={**os.environ, "PYTHONPATH": path, **cell.env},
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
        outcome.status, outcome.reason = (
            "not_run",
            f"{reason}; run it in this Python environment with `gdn-matrix run {cell.name} --runtime host`"
            f" (`nox -s {cell.name} -- --runtime host`), or `nox -s local` for the host cell",
        )
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


def _manifest(path: Path) -> dict | None:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def stand_in_labels(manifest_path: Path) -> list[str]:
    """The stand-in modules the cell's probe found (tests/standins): results produced with them are
    not results of real wheels, and the report says so."""
    manifest = _manifest(manifest_path) or {}
    return sorted({s["stand_in"] for s in manifest.values() if isinstance(s, dict) and s.get("stand_in")})


def differences_from_pins(cell: Cell, manifest_path: Path) -> list[PinDifference] | None:
    """The cell's pins that the environment it ran in lacks; None without a manifest to compare."""
    manifest = _manifest(manifest_path)
    return None if manifest is None else pin_differences(cell.versions, manifest)


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
    host_root: Path | None = None,
    runtime: Runtime | None = None,
) -> CellOutcome:
    """Run `cell` in its own runtime, or in `runtime` where given. `host_root` (default $GDN_HOST_ROOT,
    else /) is where the device kind's marker is looked for."""
    as_run = cell if runtime in (None, cell.runtime) else cell.in_runtime(runtime)
    results_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=results_root, prefix=f".staging-{cell.name}-"))
    outcome = CellOutcome(
        cell=cell.name,
        status="error",
        device=cell.device,
        runtime=as_run.runtime,
        matrix_runtime=cell.runtime,
        started_at=_now(),
        families=list(cell.families),
    )
    started = time.monotonic()
    log = CellLog(staging / "log.txt", echo)
    try:
        # a host run's packages are the host's, not the lock's: its pin differences say what ran
        if as_run.runtime == "docker":
            outcome.lock = lock_summary(matrix, cell, root)
        absent = devices.kind(cell.device).absent_reason(host_root)
        if absent:
            outcome.status, outcome.reason = "not_run", absent
        elif as_run.runtime == "host":
            outcome.real_hardware = True
            code, timed_out = _run_host(as_run, root, staging, log)
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
        outcome.pin_differences = differences_from_pins(cell, staging / "manifest.json")
        outcome.write(staging)
        _publish(staging, results_root / cell.name)
    return outcome
