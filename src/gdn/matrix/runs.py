"""One run of a cell at a time, and the record of a run that died.

A run of a cell holds the cell's run guard, results/.guards/<cell>.guard (a filelock), while it runs,
and stages its files in results/.staging/<cell>/run-*/. Beside them it leaves a marker,
results/.staging/<cell>/runner.json (the runner's pid and host, when it started, its staging
directory), until its result is in place or its interruption recorded. The guard goes with its holder
however that dies; the marker stays when the runner is killed outright (SIGKILL, the OOM killer, a
hard cancel), which no handler sees. Whoever takes the guard next, the next run of the cell or
`gdn-matrix report`, knows that no run is live: a marker it finds is a dead run's, which it records as
interrupted beside the last complete result (interrupted.json, with the tests that run had finished),
before it clears what dead runs left.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from gdn.matrix import outcomes
from gdn.matrix.jsonio import UnreadableFileError, read_json, read_tail, write_json
from gdn.matrix.results import INTERRUPTED
from gdn.matrix.schema import InterruptedRun

GUARDS = ".guards"
STAGING = ".staging"
MARKER = "runner.json"
LOG = "log.txt"
LOG_TAIL_LINES = 60
# how much of a dead run's log.txt is read for its tail
LOG_TAIL_BYTES = 64 << 10
# what interrupted.json says of the signal of a run whose runner died: nothing saw it
SIGNAL_UNKNOWN = "unknown"
BAD = ("failed", "error")
FAILED_NAMED = 5


class CellBusyError(RuntimeError):
    """Another run of the cell holds its run guard, and the wait for it ran out."""


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def cell_staging(results_root: Path, cell: str) -> Path:
    return results_root / STAGING / cell


@contextlib.contextmanager
def guarded(results_root: Path, cell: str, echo: Callable[[str], None], wait_s: float | None) -> Iterator[None]:
    """Hold the cell's run guard: wait (at most wait_s, forever for None) while another run holds it."""
    path = results_root / GUARDS / f"{cell}.guard"
    path.parent.mkdir(parents=True, exist_ok=True)
    guard = FileLock(path)
    try:
        guard.acquire(timeout=0)
    except Timeout:
        echo(f"cell {cell}: another run of this cell holds {path}; waiting for it to finish")
        try:
            guard.acquire(timeout=-1 if wait_s is None else wait_s)
        except Timeout:
            raise CellBusyError(
                f"cell {cell}: another run of this cell still holds {path} after {wait_s:g} s"
            ) from None
    try:
        yield
    finally:
        guard.release()


@dataclass
class RunMarker:
    """runner.json: the live run of a cell, as long as it is live."""

    pid: int
    host: str
    started_at: str
    # the run's staging directory, a name in results/.staging/<cell>/
    staging: str


def mark_run(staging: Path, started_at: str) -> None:
    """Leave the marker of the run staged in `staging` (the caller holds the cell's guard)."""
    write_json(staging.parent / MARKER, asdict(RunMarker(os.getpid(), socket.gethostname(), started_at, staging.name)))


def unmark_run(staging: Path) -> None:
    (staging.parent / MARKER).unlink(missing_ok=True)


def _tests_finished(staging: Path) -> tuple[dict[str, int], list[str], str]:
    """From a run's tests.jsonl: counts by outcome, the failed and errored tests ("nodeid: message"),
    and the counts as text; nothing where the file is absent or unreadable."""
    try:
        finished = outcomes.read_finished(staging / outcomes.FILE)
    except (OSError, UnreadableFileError):
        finished = []
    counts = Counter(t.outcome for t in finished)
    tests_finished = {o: counts[o] for o in outcomes.OUTCOMES if counts[o]}
    failed = [f"{t.nodeid}: {t.message}" if t.message else t.nodeid for t in finished if t.outcome in BAD]
    return tests_finished, failed, ", ".join(f"{n} {o}" for o, n in tests_finished.items())


def record_interruption(
    final: Path, cell: str, staging: Path, *, signal: str, cause: str, started_at: str, at: str, log_tail: str | None
) -> InterruptedRun:
    """Write final/interrupted.json for the run staged in `staging`, beside the last complete result
    (whose files it never touches): `cause` (e.g. "interrupted by SIGTERM"), then what is shown instead,
    then the tests the run had finished."""
    before = "the results shown are of the last complete run" if final.exists() else "no complete run is recorded"
    tests_finished, failed, tally = _tests_finished(staging)
    record = InterruptedRun(
        cell=cell,
        signal=signal,
        started_at=started_at,
        interrupted_at=at,
        reason=f"{cause}: {before}" + (f"; its tests before it stopped: {tally}" if tally else ""),
        log_tail=log_tail,
        tests_finished=tests_finished,
        tests_failed=failed,
        runner_died=signal == SIGNAL_UNKNOWN,
    )
    write_json(final / INTERRUPTED, asdict(record))
    return record


def _log_tail(path: Path) -> str | None:
    """The last lines of a dead run's log.txt, read from its end."""
    try:
        lines = read_tail(path, LOG_TAIL_BYTES).decode("utf-8", "replace").splitlines()
    except (OSError, UnreadableFileError):
        return None
    return "\n".join(lines[-LOG_TAIL_LINES:]) or None


def _last_sign_of_life(staging: Path) -> str:
    """When the dead run last wrote a file: as near as anything comes to the time it died."""
    times = [path.lstat().st_mtime for path in staging.iterdir()] or [staging.lstat().st_mtime]
    return dt.datetime.fromtimestamp(max(times), dt.timezone.utc).isoformat(timespec="seconds")


def _dead_run(results_root: Path, cell: str) -> InterruptedRun | None:
    """The interruption of the run whose marker is left, recorded; None without one, or where its
    staging directory is gone (it died after its result was in place)."""
    staging_root = cell_staging(results_root, cell)
    try:
        marker = RunMarker(**read_json(staging_root / MARKER))
    except (UnreadableFileError, TypeError):  # none, or not a marker: nothing to say of that run
        return None
    name = str(marker.staging)
    staging = staging_root / name
    if not name.startswith("run-") or "/" in name or staging.is_symlink() or not staging.is_dir():
        return None
    cause = (
        f"the runner (pid {marker.pid} on {marker.host}) died without recording its end: killed outright "
        "(SIGKILL: the OOM killer, a hard cancel) or crashed"
    )
    return record_interruption(
        results_root / cell,
        cell,
        staging,
        signal=SIGNAL_UNKNOWN,
        cause=cause,
        started_at=str(marker.started_at),
        at=_last_sign_of_life(staging),
        log_tail=_log_tail(staging / LOG),
    )


def clear_dead_runs(results_root: Path, cell: str) -> InterruptedRun | None:
    """Under the cell's guard (no run of it is live): record the run that died with its marker left,
    put back a previous result that a killed run had moved aside but not replaced, and remove what dead
    runs left in the cell's staging directory. Returns the dead run's record, if there was one."""
    staging_root = cell_staging(results_root, cell)
    if not staging_root.is_dir():
        return None
    final = results_root / cell
    moved = sorted(staging_root.glob("old-*"), key=lambda p: p.stat().st_mtime)
    if moved and not final.exists():
        moved[-1].rename(final)
    died = _dead_run(results_root, cell)
    for leftover in staging_root.iterdir():
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    return died


def clear_every_dead_run(results_root: Path) -> list[InterruptedRun]:
    """clear_dead_runs for each cell with a staging directory whose guard is free now (a cell whose run
    is live is left alone): what `gdn-matrix report` does first."""
    found = []
    for staging_root in sorted((results_root / STAGING).glob("*")):
        if not staging_root.is_dir() or staging_root.is_symlink():
            continue
        with contextlib.suppress(CellBusyError), guarded(results_root, staging_root.name, lambda _line: None, 0):
            died = clear_dead_runs(results_root, staging_root.name)
            if died is not None:
                found.append(died)
    return found
