"""Run one cell end to end, in a container or on the host, and leave results/<cell>/ whatever happens.

A cell that cannot run here (no NPU, no GPU, no docker engine), fails to build, crashes or times out
still gets a cell.json saying so, with the log tail. Results are staged in a private directory and
moved into place in one rename, so a cell never leaves half a result and never touches another's.

One run of a cell at a time: a run guard per cell (gdn.matrix.runs) makes a second run wait for the
first, so neither deletes the other's results; whoever holds the guard knows that every staging
directory of the cell (results/.staging/<cell>/) is left over from a dead run, records a run that died
with its marker left, and removes the rest. A cell's processes run in their own process group, which
is ended as a whole on a timeout, SIGTERM or SIGINT (a container is removed), and which ends itself
when the runner dies outright: the cell entry watches its stdin, a pipe whose other end only the
runner holds. A run stopped by SIGTERM or SIGINT is recorded in results/<cell>/interrupted.json beside
the last complete run, whose files it never touches.

Any cell can run in the host runtime (a docker cell on a GPU box without docker): it then runs in this
Python environment, not its image, and cell.json says so, with every pin the environment does not have.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from gdn.matrix import devices, runs
from gdn.matrix.config import Cell, Matrix, MatrixConfigError, Runtime, cell_files
from gdn.matrix.jsonio import UnreadableFileError, read_json
from gdn.matrix.lock import lock_summary
from gdn.matrix.results import status_of
from gdn.matrix.schema import CellLock, CellOutcome, PinDifference
from gdn.matrix.versions import pin_differences

# how long the cell's processes get to exit on SIGTERM before the group is killed
GRACE_S = 5.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CONTAINER_SOURCE = Path("/src")
CONTAINER_RESULTS = Path("/results")


class CellInterruptedError(BaseException):
    """The run was stopped by a signal; its interruption is recorded beside the last complete run.
    A BaseException, like KeyboardInterrupt, so that no `except Exception` on the way turns it into a
    result."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT raise CellInterruptedError while the cell runs, so that its processes are ended
    and the interruption recorded. Handlers can be set from the main thread only; elsewhere the caller
    owns the signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame) -> None:
        raise CellInterruptedError(signum)

    previous = {signum: signal.signal(signum, interrupt) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT wait until the results are in place: a rename half done would lose them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def end_group(process: subprocess.Popen, grace_s: float) -> None:
    """End the process and everything it started (its session's process group): SIGTERM, then
    SIGKILL for whatever is left after grace_s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class CellLog:
    """Everything the cell prints: echoed, kept whole in log.txt and as a tail for cell.json."""

    def __init__(self, path: Path, echo: Callable[[str], None]):
        self.handle = path.open("w")
        self.tail: deque[str] = deque(maxlen=runs.LOG_TAIL_LINES)
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
    command = [python, "-m", "gdn.matrix.entry", "--cell", cell.name, "--out", str(out), "--end-with-stdin"]
    command += ["--families", ",".join(cell.families), "--mode", cell.compute_mode, "--tests", str(source / "tests")]
    command += ["--probe-mode", cell.probe_mode] if cell.probe_mode else []
    return command + (["--bench"] if cell.bench else [])


def _run_host(cell: Cell, root: Path, out: Path, log: CellLog) -> tuple[int | None, bool]:
    """The same entry as in a container, in this Python environment; returns (exit code, timed out).
    The checkout's source comes first on the path, as in a container: the interpreter (nox's own, for
    a docker cell's session) need not have gdn installed."""
    env_cmd = entry_command(cell, out, root, python=sys.executable)
    path = os.pathsep.join(p for p in (str(root / "src"), os.environ.get("PYTHONPATH")) if p)
    # a session of its own: the whole group (pytest, its workers, whatever a test starts) is ended
    # with the cell, and a Ctrl-C in the terminal reaches the runner only, which ends the group. Its
    # stdin is a pipe only this process holds the other end of: should this process die outright, the
    # pipe closes and the entry ends its group (entry --end-with-stdin)
    process = subprocess.Popen(
        env_cmd,
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env={**os.environ, "PYTHONPATH": path, **cell.env},
        start_new_session=True,
    )
    reader = threading.Thread(target=lambda: [log(line) for line in process.stdout], daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=cell.timeout_s)
    except subprocess.TimeoutExpired:
        end_group(process, GRACE_S)
        reader.join(timeout=5)
        return None, True
    except BaseException:
        end_group(process, GRACE_S)
        raise
    finally:
        process.stdin.close()
    # the entry is done; anything it left running in its group is not part of a result
    end_group(process, 0)
    reader.join(timeout=5)
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
        manifest = read_json(path)
    except UnreadableFileError:  # absent, not a regular file, too large, not strict JSON
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
    trash = staging.with_name(f"old-{staging.name}")
    with _signals_held():
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
    wait_s: float | None = None,
) -> CellOutcome:
    """Run `cell` in its own runtime, or in `runtime` where given. `host_root` (default $GDN_HOST_ROOT,
    else /) is where the device kind's marker is looked for. While another run of the cell is in
    progress this waits for it (at most wait_s seconds, then CellBusyError); a run stopped by SIGTERM or
    SIGINT raises CellInterruptedError once its interruption is recorded."""
    results_root.mkdir(parents=True, exist_ok=True)
    with runs.guarded(results_root, cell.name, echo, wait_s):
        died = runs.clear_dead_runs(results_root, cell.name)
        if died is not None:
            echo(f"cell {cell.name}: previous run: {died.reason}")
        cell_staging = runs.cell_staging(results_root, cell.name)
        cell_staging.mkdir(parents=True, exist_ok=True)
        try:
            return _run_locked(matrix, cell, root, results_root, cell_staging, echo, host_root, runtime)
        finally:
            with contextlib.suppress(OSError):  # not empty: a run killed outright, cleared by the next
                cell_staging.rmdir()


def _run_locked(
    matrix: Matrix,
    cell: Cell,
    root: Path,
    results_root: Path,
    cell_staging: Path,
    echo: Callable[[str], None],
    host_root: Path | None,
    runtime: Runtime | None,
) -> CellOutcome:
    as_run = cell if runtime in (None, cell.runtime) else cell.in_runtime(runtime)
    final = results_root / cell.name
    staging = Path(tempfile.mkdtemp(dir=cell_staging, prefix="run-"))
    outcome = CellOutcome(
        cell=cell.name,
        status="error",
        device=cell.device,
        runtime=as_run.runtime,
        matrix_runtime=cell.runtime,
        started_at=runs.now(),
        families=list(cell.families),
    )
    # until the result is in place: a runner killed outright leaves it for the next to find
    runs.mark_run(staging, outcome.started_at)
    try:
        return _run_marked(matrix, cell, as_run, root, staging, final, outcome, echo, host_root)
    finally:
        runs.unmark_run(staging)


def _run_marked(
    matrix: Matrix,
    cell: Cell,
    as_run: Cell,
    root: Path,
    staging: Path,
    final: Path,
    outcome: CellOutcome,
    echo: Callable[[str], None],
    host_root: Path | None,
) -> CellOutcome:
    started = time.monotonic()
    log = CellLog(staging / runs.LOG, echo)
    try:
        with _signals_interrupt():
            _run(matrix, cell, as_run, root, staging, log, outcome, host_root)
    except (CellInterruptedError, KeyboardInterrupt) as exc:
        log.close()
        signum = exc.signum if isinstance(exc, CellInterruptedError) else signal.SIGINT
        name = signal.Signals(signum).name
        with _signals_held():
            runs.record_interruption(
                final,
                cell.name,
                staging,
                signal=name,
                cause=f"interrupted by {name}",
                started_at=outcome.started_at or runs.now(),
                at=runs.now(),
                log_tail=log.text() or None,
            )
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, KeyboardInterrupt):
            raise CellInterruptedError(signum) from None
        raise
    log.close()
    outcome.finished_at = runs.now()
    outcome.duration_s = round(time.monotonic() - started, 2)
    outcome.log_tail = outcome.log_tail or log.text() or None
    outcome.stand_ins = stand_in_labels(staging / "manifest.json")
    outcome.pin_differences = differences_from_pins(cell, staging / "manifest.json")
    outcome.write(staging)
    _publish(staging, final)
    return outcome


def _run(
    matrix: Matrix,
    cell: Cell,
    as_run: Cell,
    root: Path,
    staging: Path,
    log: CellLog,
    outcome: CellOutcome,
    host_root: Path | None,
) -> None:
    try:
        # a host run's packages are the host's, not the lock's: its pin differences say what ran
        if as_run.runtime == "docker":
            summary = lock_summary(matrix, cell, root)
            outcome.lock = CellLock(**summary) if summary else None
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
