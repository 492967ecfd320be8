"""The history of reports: a directory of kept reports, one entry per report (`gdn-matrix history add`,
gdn.matrix.history), read back by the site (gdn.matrix.history_site) and whatever compares reports
over time.

An entry is a directory named after the report's generated time and a digest of what it keeps, so the
same report added twice is one entry. It holds report.json, each cell's small files under
cells/<cell>/ (never its log) and entry.json (schema.HistoryEntry: every file's size and sha256).
Retention is enforced on every add: at most --keep entries and --max-mb megabytes, the oldest reports
(by generated time) pruned first.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from gdn.matrix import schema
from gdn.matrix.config import CELL_NAME, CELL_NAME_MAX
from gdn.matrix.jsonio import REPORT_FILE_MAX_BYTES, UnreadableFileError, read_capped
from gdn.matrix.schema import HistoryEntry, KeptFile, Report

HISTORY_DIR = Path("history")
# A year of daily reports on a default-branch schedule, and far below what a Pages site holds (1 GB).
KEEP_ENTRIES = 365
MAX_MB = 200
# A cell's file past this is left out of its entry (named in entry.json): a full shape grid's junit.xml
# is under 2 MB, so only a broken run's output reaches it, and report.json already summarises that.
CELL_FILE_MAX_BYTES = 4 << 20
# What the report build reads of a cell; its log (log.txt) is not kept.
CELL_FILES = (
    "cell.json",
    "interrupted.json",
    "manifest.json",
    "resolution.json",
    "tests.jsonl",
    "junit.xml",
    "kernels.json",
    "accuracy.json",
    "bench.json",
    "reruns.json",
    "entry.json",
)
ENTRY_FILE = "entry.json"
CELLS_DIR = "cells"


class HistoryError(ValueError):
    """A report or a history that cannot be used; the message says what and why."""


@dataclass(frozen=True)
class StoredEntry:
    """An entry as read back: its record and its directory."""

    entry: HistoryEntry
    path: Path

    @property
    def generated(self) -> datetime:
        return generated_time(self.entry.generated_at)


def generated_time(text: str) -> datetime:
    """A report's generated_at as an aware UTC time (a time without a zone is taken as UTC)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise HistoryError(f"report.json: generated_at: expected an ISO 8601 time, got {text!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _gather(report_dir: Path, results_root: Path) -> tuple[Report, dict[str, bytes], list[str], list[str]]:
    """The report, and what its entry keeps: {path in the entry: content}, the cells whose files were
    found, and the files left out with the reason."""
    source = report_dir / "report.json"
    try:
        text = read_capped(source, REPORT_FILE_MAX_BYTES)
    except FileNotFoundError:
        raise HistoryError(f"{report_dir}: no report.json (expected the directory `gdn-matrix report` wrote)") from None
    except (OSError, UnreadableFileError) as exc:
        raise HistoryError(f"{source}: {exc}") from None
    try:
        report = schema.load(Report, text, str(source))
    except schema.SchemaError as exc:
        raise HistoryError(f"report does not validate: {exc}") from None
    generated_time(report.generated_at)
    kept, cells, left_out = {"report.json": text}, [], []
    for cell in report.cells:
        # a name comes from the file: only a cell name as matrix.yaml allows one becomes a path
        if not CELL_NAME.fullmatch(cell.name) or len(cell.name) > CELL_NAME_MAX:
            left_out.append(f"{cell.name!r} (not a cell name: its files are not looked for)")
            continue
        directory = results_root / cell.name
        if not directory.is_dir() or directory.is_symlink():
            continue
        found = False
        for name in CELL_FILES:
            path = directory / name
            if not path.exists() and not path.is_symlink():
                continue
            try:
                kept[f"{CELLS_DIR}/{cell.name}/{name}"] = read_capped(path, CELL_FILE_MAX_BYTES)
                found = True
            except (OSError, UnreadableFileError) as exc:
                left_out.append(f"{cell.name}/{name} ({exc})")
        if found:
            cells.append(cell.name)
    return report, kept, cells, left_out


def entry_key(generated: datetime, digest: str) -> str:
    """`20261205T041500Z-1a2b3c4d5e6f`: sorts by generated time; the digest tells two reports of one
    second apart."""
    return f"{generated.strftime('%Y%m%dT%H%M%SZ')}-{digest.removeprefix('sha256:')[:12]}"


def read_entries(history: Path) -> tuple[list[StoredEntry], list[str]]:
    """The history's entries, oldest report first, and a line for each directory that is not one."""
    entries, problems = [], []
    for path in sorted(history.iterdir()) if history.is_dir() else []:
        if path.name.startswith(".") or not path.is_dir() or path.is_symlink():
            continue
        try:
            entry, _ = schema.load_file(HistoryEntry, path / ENTRY_FILE)
            stored = StoredEntry(entry, path)
            stored.generated  # noqa: B018 - refused here, not while sorting
        except (schema.SchemaError, HistoryError) as exc:
            problems.append(f"{path.name}: not a history entry: {exc}")
            continue
        entries.append(stored)
    entries.sort(key=lambda s: (s.generated, s.entry.key))
    return entries, problems


def read_report(stored: StoredEntry) -> Report:
    """The entry's report.json, validated as `gdn-matrix diff` reads one; SchemaError says why not."""
    report, _ = schema.load_file(Report, stored.path / "report.json", REPORT_FILE_MAX_BYTES)
    return report


def prune(history: Path, keep: int, max_bytes: int) -> list[str]:
    """Remove the oldest entries until at most `keep` remain within `max_bytes`; their keys."""
    entries, _ = read_entries(history)
    total = sum(s.entry.total_bytes for s in entries)
    removed = []
    while entries and (len(entries) > keep or total > max_bytes):
        oldest = entries.pop(0)
        total -= oldest.entry.total_bytes
        shutil.rmtree(oldest.path)
        removed.append(oldest.entry.key)
    return removed


@dataclass(frozen=True)
class Added:
    key: str
    new: bool
    pruned: list[str]


def add_report(
    report_dir: Path,
    history: Path,
    *,
    results_root: Path | None = None,
    keep: int = KEEP_ENTRIES,
    max_bytes: int = MAX_MB << 20,
) -> Added:
    """Keep the report of `report_dir` (its cells' files from `results_root`, default its parent: the
    results layout) in `history`, then enforce the retention bounds. Adding a kept report again
    changes nothing."""
    report, kept, cells, left_out = _gather(report_dir, results_root or report_dir.parent)
    files = [KeptFile(path, len(data), _sha256(data)) for path, data in sorted(kept.items())]
    digest = "sha256:" + _sha256("".join(f"{f.path} {f.sha256}\n" for f in files).encode())
    size = sum(f.bytes for f in files)
    if size > max_bytes:
        raise HistoryError(f"the report's files take {size} bytes, more than the history's bound ({max_bytes} bytes)")
    key = entry_key(generated_time(report.generated_at), digest)
    history.mkdir(parents=True, exist_ok=True)
    with FileLock(history / ".lock"):
        entries, _ = read_entries(history)
        if any(s.entry.digest == digest for s in entries):
            return Added(key, False, [])
        added_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        entry = HistoryEntry(key, report.generated_at, digest, added_at, files, cells, left_out)
        # staged beside the entries and renamed into place: a reader never sees half an entry
        staging = Path(tempfile.mkdtemp(dir=history, prefix=".adding-"))
        try:
            for path, data in kept.items():
                target = staging / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            entry.write(staging)
            staging.rename(history / key)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return Added(key, True, prune(history, keep, max_bytes))
