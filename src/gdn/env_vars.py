"""Environment variables that every op call reads (GDN_COMPUTE_MODE, GDN_VALUE_CHECKS), read so that a
change made through os.environ shows in the next call at little cost.

`os.environ.get` goes through four Python frames (Mapping.get, `__getitem__`, the name's encoding and
the value's decoding): about 1.3 µs a read inside a B = 1 decode call on the CI CPU, two reads a call.
On POSIX, CPython's os.environ keeps its entries in a dict of encoded names and values (`_data`, which
`os.environ[...] = ...`, `del`, `clear()` and pytest's monkeypatch update, and which `os.environ.get`
itself reads), so `read` looks the encoded name up there and decodes a value only when it differs from
the last one decoded for that name. Where that dict is not there, or os.environ has been replaced by
another object, `read` is `os.environ.get`."""

from __future__ import annotations

import os

_ENVIRON = os.environ
_DATA = getattr(_ENVIRON, "_data", None)
_DIRECT = os.name == "posix" and type(_DATA) is dict
# name -> (its encoded form, the last raw value read, that value decoded)
_seen: dict[str, tuple[bytes, bytes | None, str | None]] = {}


def read(name: str, default: str) -> str:
    """os.environ.get(name, default)."""
    if not _DIRECT or os.environ is not _ENVIRON:
        return os.environ.get(name, default)
    seen = _seen.get(name)
    if seen is None:
        seen = _seen[name] = (os.fsencode(name), None, None)
    key, last_raw, last_value = seen
    raw = _DATA.get(key)
    if raw is None:
        return default
    if raw is not last_raw:
        last_value = os.fsdecode(raw)
        _seen[name] = (key, raw, last_value)
    return last_value
