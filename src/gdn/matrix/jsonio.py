"""Reading and writing the matrix's JSON files. Writes go through a temporary file and a rename, so a
reader never sees half of one. Reads are bounded: a file that is not a regular file (a symlink to
/dev/zero, a FIFO) is refused before it is read, so is one past its size cap, and JSON is read
strictly (no NaN or infinity, no nesting past a limit), each refusal naming the file and the field.
Standard library only: the cell entry writes through this inside the cell's image."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO

# What one results file (cell.json, junit.xml, bench.json, ...) may hold: far above what a cell
# writes (a full shape grid's junit.xml is under 2 MB), far below what would hurt the reader.
RESULTS_FILE_MAX_BYTES = 16 << 20
# report.json gathers every cell's results
REPORT_FILE_MAX_BYTES = 64 << 20
# Far deeper than any file the matrix writes (report.json's resolutions reach 7 levels).
JSON_MAX_DEPTH = 64


class UnreadableFileError(ValueError):
    """A file refused before or while it is read; the message names the file and, for JSON, the field."""


def atomic_write(path: Path, text: str) -> None:
    """Write through a temporary file in the same directory and rename it over the target. A new file
    gets the mode the umask gives any file written here (the temporary file is opened with 0o666, not
    mkstemp's owner-only 0o600); a rewritten one keeps its mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "w") as handle:
            with contextlib.suppress(FileNotFoundError):
                os.fchmod(handle.fileno(), stat.S_IMODE(path.stat().st_mode))
            handle.write(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, payload: Any) -> None:
    atomic_write(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def _open_regular(path: Path, follow_symlinks: bool) -> BinaryIO:
    """`path` opened for reading when it is a regular file (a symlink only if `follow_symlinks`)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        if path.is_symlink():
            raise UnreadableFileError(f"{path.name} is a symlink, not a regular file")
        flags |= getattr(os, "O_NOFOLLOW", 0)
    handle = os.fdopen(os.open(path, flags), "rb")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise UnreadableFileError(f"{path.name} is not a regular file")
    return handle


def read_capped(path: Path, limit: int, *, follow_symlinks: bool = False) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. A symlink is refused unless
    `follow_symlinks` (the results of a run hold none), and so is anything else that is not a regular
    file, before a byte is read; OSError where the file cannot be opened at all."""
    with _open_regular(path, follow_symlinks) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFileError(f"{path.name} is larger than the {limit} bytes such a file may have")
    return data


def read_tail(path: Path, limit: int) -> bytes:
    """The last `limit` bytes of a regular file (a log that may be of any length), never through a
    symlink; UnreadableFileError or OSError as read_capped."""
    with _open_regular(path, follow_symlinks=False) as handle:
        handle.seek(max(0, os.fstat(handle.fileno()).st_size - limit))
        return handle.read(limit)


def location(parts: tuple[Any, ...] | list[Any]) -> str:
    """('cells', 0, 'failures', 1, 'outcome') -> cells[0].failures[1].outcome"""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _number_text(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def check_json_value(value: Any, source: str, max_depth: int = JSON_MAX_DEPTH) -> None:
    """Refuse what strict JSON does not have (NaN, infinities: Python's json reads and writes them) and
    nesting deeper than `max_depth`, naming `source` and the field. Iterative, so depth costs no stack."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, where = stack.pop()
        if len(where) > max_depth:
            raise UnreadableFileError(f"{source}: {location(where[:max_depth])}: nested deeper than {max_depth} levels")
        if isinstance(item, float) and not math.isfinite(item):
            raise UnreadableFileError(f"{source}: {location(where)}: {_number_text(item)} is not a finite number")
        if isinstance(item, dict):
            stack += [(child, (*where, key)) for key, child in item.items()]
        elif isinstance(item, list):
            stack += [(child, (*where, i)) for i, child in enumerate(item)]


def parse_json(data: bytes | str, source: str, max_depth: int = JSON_MAX_DEPTH) -> Any:
    """`data` as strict JSON; UnreadableFileError names `source` and what is wrong."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise UnreadableFileError(f"{source}: nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise UnreadableFileError(f"{source} is not JSON: {exc}") from None
    check_json_value(value, source, max_depth)
    return value


def read_json(path: Path, limit: int = RESULTS_FILE_MAX_BYTES) -> Any:
    """A results file's JSON, read within `limit` bytes and strictly (see parse_json)."""
    try:
        data = read_capped(path, limit)
    except OSError as exc:
        raise UnreadableFileError(f"{path.name} is unreadable: {exc}") from None
    return parse_json(data, path.name)
