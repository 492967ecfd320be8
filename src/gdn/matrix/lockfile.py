"""The lock file's format: what `gdn-matrix lock` writes, and the only thing a reader of a lock (its
check, the image build, a cell's record) accepts.

A lock is a pip requirements file that pip and uv install with `--require-hashes`:

    # Lock of the gdn-matrix cell npu-2610: refresh with `gdn-matrix lock npu-2610`.
    # cell: npu-2610
    # platform: aarch64-manylinux_2_28
    # python: 3.11
    # uv: 0.13.9
    # inputs: sha256:<digest of what was locked: pins, test tools, overrides, wheel names, platform>
    # wheelhouse: <file> sha256:<hex>   (or: hash not recorded: file absent when locked)
    # body: sha256:<digest of every line below the header>
    annotated-doc==0.0.7 \\
        --hash=sha256:<64 hex> \\
        --hash=sha256:<64 hex>
        # via typer

The header is the run of `#` lines at the top, `body` its last field. Every line of the body is a
comment, a pinned requirement `name==version \\` or its `    --hash=sha256:<64 hex>` continuation
(` \\` on all but the last). Anything else, a pip option above all (`--index-url`: pip obeys it), is
refused, and so are a package listed twice, a package without a hash, one hash under two packages, a
carriage return, a control character, bytes that are not UTF-8 and a last line without its newline.
The body's digest in the header catches any other edit. Each refusal names the line.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict

NOT_RECORDED = "hash not recorded: file absent when locked"
HEADER_KEYS = ("cell", "platform", "python", "uv", "inputs")
# how many of a lock's problems one message lists
PROBLEMS_SHOWN = 20

_FIELD = re.compile(r"# (cell|platform|python|uv|inputs|wheelhouse|body): (.+)")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_REQUIREMENT = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9.+!_-]+)( \\)?")
_HASH = re.compile(r"    --hash=sha256:([0-9a-f]{64})( \\)?")
_COMMENT = re.compile(r"\s*#.*")
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")


class LockFileError(ValueError):
    """A lock that is not a whole, untouched one: every problem found, each `line N: what`. Where every
    line is well formed and only the body's digest or a wheelhouse entry does not match, `lock` is what
    the lines say, so that a check can name the lines that differ from the index."""

    def __init__(self, problems: list[str], lock: Lock | None = None) -> None:
        shown = "; ".join(problems[:PROBLEMS_SHOWN])
        more = f"; and {len(problems) - PROBLEMS_SHOWN} more" if len(problems) > PROBLEMS_SHOWN else ""
        super().__init__(shown + more)
        self.problems = problems
        self.lock = lock


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WheelhouseFile(_Frozen):
    file: str
    name: str
    version: str
    sha256: str | None


class Lock(_Frozen):
    """A lock file read back."""

    cell: str
    platform: str
    python: str
    uv: str
    inputs: str
    # sha256 of the whole file: what the report shows and the image tag covers
    digest: str
    # canonical distribution name -> version, wheelhouse files included
    packages: dict[str, str]
    wheelhouse: tuple[WheelhouseFile, ...] = ()
    # canonical name -> the sha256 hashes the body lists for it, each with its line; the line of its
    # requirement
    hashes: dict[str, dict[str, int]] = {}
    lines: dict[str, int] = {}

    @property
    def unrecorded(self) -> tuple[WheelhouseFile, ...]:
        return tuple(f for f in self.wheelhouse if f.sha256 is None)

    def summary(self) -> dict[str, object]:
        """What a cell's report entry carries: {"digest", "packages"}."""
        return {"digest": self.digest, "packages": dict(sorted(self.packages.items()))}


def file_sha256(path: Path) -> str:
    """A file's sha256 in hex, as a wheelhouse line and a pip `--hash` carry it; read in blocks, so a
    wheel of gigabytes never sits in memory whole."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def body_digest(body: str) -> str:
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def render_header(fields: list[tuple[str, str]], body: str, cell: str) -> str:
    """The header for `fields` (key, value in order, HEADER_KEYS and wheelhouse) over `body`."""
    lines = [f"# Lock of the gdn-matrix cell {cell}: refresh with `gdn-matrix lock {cell}`."]
    lines += [f"# {key}: {value}" for key, value in fields]
    lines.append(f"# body: {body_digest(body)}")
    return "\n".join(lines) + "\n"


@dataclass
class Requirement:
    """One `name==version` entry of a body and its hashes."""

    name: str
    version: str
    line: int
    # sha256 hex -> its line
    hashes: dict[str, int]


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """(number from 1, line) of a text whose every line ends in LF."""
    yield from enumerate(text.split("\n")[:-1], start=1)


def _text(data: bytes, problems: list[str]) -> str | None:
    """The file as text when it is UTF-8, LF-terminated and free of control characters."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        problems.append(f"line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x})")
        return None
    if "\r" in text:
        line = text[: text.index("\r")].count("\n") + 1
        what = "a CRLF line ending" if "\r\n" in text else "a carriage return"
        problems.append(f"line {line}: {what}; a lock's lines end in LF alone")
    for number, line in _lines(text + "\n"):
        control = _CONTROL.search(line.rstrip("\r"))
        if control:
            problems.append(f"line {number}: control character U+{ord(control.group()):04X}")
    if not text.endswith("\n"):
        problems.append(f"line {text.count(chr(10)) + 1}: no newline at its end: the file is cut short")
    return None if problems else text


def parse_body(text: str, first_line: int = 1) -> tuple[list[Requirement], list[str]]:
    """The requirements of a lock's body (or of uv's resolution, which is one), and every line that is
    not a comment, a pinned requirement or its hash continuation."""
    requirements: list[Requirement] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    owners: dict[str, tuple[str, int]] = {}
    continued: Requirement | None = None
    for offset, line in _lines(text):
        number = first_line + offset - 1
        if continued is not None:
            found = _HASH.fullmatch(line)
            if found:
                digest = found.group(1)
                if digest in owners and owners[digest][0] != continued.name:
                    owner, at = owners[digest]
                    problems.append(
                        f"line {number}: sha256:{digest[:12]}… is listed for both {owner} (line {at}) and "
                        f"{continued.name}: each file has its own hash"
                    )
                owners.setdefault(digest, (continued.name, number))
                continued.hashes[digest] = number
                continued = continued if found.group(2) else None
                continue
            problems.append(
                f"line {number}: {continued.name}=={continued.version} continues here, but {line!r} is not a "
                "`    --hash=sha256:<64 hex>` line"
            )
            if line.lstrip().startswith("--hash"):  # a hash cut or mangled: the entry may go on after it
                continued = continued if line.endswith(" \\") else None
                continue
            continued = None
        if _COMMENT.fullmatch(line):
            continue
        found = _REQUIREMENT.fullmatch(line)
        if found is None:
            problems.append(f"line {number}: {_not_a_requirement(line)}")
            continue
        name, version = canonicalize_name(found.group(1)), found.group(2)
        try:
            Version(version)
        except InvalidVersion:
            problems.append(f"line {number}: {found.group(1)}=={version}: {version!r} is not a version")
        if name in seen:
            problems.append(f"line {number}: {name} is listed twice (first at line {seen[name]})")
        seen.setdefault(name, number)
        requirement = Requirement(name, version, number, {})
        requirements.append(requirement)
        if found.group(3):
            continued = requirement
        else:
            problems.append(
                f"line {number}: {found.group(1)}=={version} has no --hash=sha256: pip's --require-hashes needs "
                "one for every package"
            )
    if continued is not None:
        problems.append(f"line {first_line + text.count(chr(10)) - 1}: ends in a continuation with nothing after it")
    return requirements, problems


def _not_a_requirement(line: str) -> str:
    stripped = line.strip()
    if not stripped:
        return "a blank line; a lock has none"
    if stripped.startswith("--hash"):
        return f"{stripped[:80]!r} continues nothing: the line before is no requirement ending in ' \\'"
    if stripped.startswith("-"):
        return f"{stripped[:80]!r} is a pip option; a lock holds none (pip would obey it)"
    return f"{stripped[:80]!r} is not a pinned requirement `name==version \\`"


def _header(lines: list[str], problems: list[str]) -> dict[str, list[tuple[int, str]]]:
    fields: dict[str, list[tuple[int, str]]] = {}
    for number, line in enumerate(lines, start=1):
        found = _FIELD.fullmatch(line)
        if found:
            fields.setdefault(found.group(1), []).append((number, found.group(2).strip()))
    absent = [key for key in (*HEADER_KEYS, "body") if key not in fields]
    if absent:
        problems.append(f"line 1: not a gdn-matrix lock (its header lacks {', '.join(absent)})")
    for key, found in fields.items():
        if key != "wheelhouse" and len(found) > 1:
            problems.append(f"line {found[1][0]}: a second `{key}` field (first at line {found[0][0]})")
    if "body" in fields and fields["body"][-1][0] != len(lines):
        problems.append(f"line {fields['body'][-1][0]}: `body` is not the header's last line")
    return fields


def _wheelhouse_entry(number: int, value: str, problems: list[str]) -> WheelhouseFile | None:
    file, _, rest = value.partition(" ")
    try:
        name, version, _, _ = parse_wheel_filename(file)
    except ValueError as exc:
        problems.append(f"line {number}: wheelhouse entry {value!r}: {exc}")
        return None
    sha = rest.removeprefix("sha256:") if _DIGEST.fullmatch(rest) else None
    if sha is None and rest != NOT_RECORDED:
        problems.append(f"line {number}: wheelhouse entry {value!r}: expected 'sha256:<64 hex>' or {NOT_RECORDED!r}")
    return WheelhouseFile(file=file, name=name, version=str(version), sha256=sha)


def _wheelhouse_problems(entries: list[tuple[int, WheelhouseFile]], requirements: dict[str, Requirement]) -> list[str]:
    """A wheelhouse file with a recorded hash is a body entry with exactly that hash; one without has no
    body entry (the image cannot verify it, so it must not seem to)."""
    problems = []
    for number, entry in entries:
        listed = requirements.get(entry.name)
        if entry.sha256 is None:
            if listed is not None:
                problems.append(
                    f"line {listed.line}: {entry.name} is listed, yet the header (line {number}) says its "
                    "wheelhouse file's hash was not recorded"
                )
        elif listed is None or listed.version != entry.version or list(listed.hashes) != [entry.sha256]:
            problems.append(
                f"line {number}: the body does not list {entry.name}=={entry.version} with this wheelhouse file's "
                f"hash alone (sha256:{entry.sha256[:12]}…)"
            )
    return problems


def parse_lock(data: bytes) -> Lock:
    """The lock in `data`; LockFileError with every problem when it is not a whole, untouched lock."""
    problems: list[str] = []
    text = _text(data, problems)
    if text is None:
        raise LockFileError(problems)
    lines = text.split("\n")[:-1]
    size = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    fields = _header(lines[:size], problems)
    body = "".join(line + "\n" for line in lines[size:])
    requirements, body_problems = parse_body(body, first_line=size + 1)
    problems += body_problems
    if not requirements:
        problems.append(f"line {size + 1}: the lock lists no package")
    entries = [(n, e) for n, v in fields.get("wheelhouse", []) if (e := _wheelhouse_entry(n, v, problems))]
    if problems:
        raise LockFileError(problems)
    # every line is well formed: what remains is whether the lines are those the lock was made with
    number, recorded = fields["body"][-1]
    if recorded != body_digest(body):
        problems.append(
            f"line {number}: the body (lines {size + 1}-{len(lines)}) is not what `gdn-matrix lock` wrote: "
            f"its digest is {body_digest(body)}, the header's {recorded}"
        )
    problems += _wheelhouse_problems(entries, {r.name: r for r in requirements})
    packages = {r.name: r.version for r in requirements}
    packages.update({e.name: e.version for _, e in entries})
    lock = Lock(
        **{key: fields[key][0][1] for key in HEADER_KEYS},
        digest="sha256:" + hashlib.sha256(data).hexdigest(),
        packages=packages,
        wheelhouse=tuple(e for _, e in entries),
        hashes={r.name: r.hashes for r in requirements},
        lines={r.name: r.line for r in requirements},
    )
    if problems:
        raise LockFileError(problems, lock)
    return lock
