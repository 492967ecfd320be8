"""gdn's error for a backend that cannot serve, strict mode, which turns a fallback into that error, and
how an exception a backend raised is told in a record. They sit below the resolver and the numeric probe,
so that backends raising them need not import either, nor the probe the backends."""

from __future__ import annotations

import os

STRICT_ENV = "GDN_STRICT"


class GdnBackendError(RuntimeError):
    """A requested backend could not serve an op and strict mode forbids falling back."""


def strict() -> bool:
    """Whether GDN_STRICT=1: a backend that cannot serve raises GdnBackendError instead of falling back."""
    return os.environ.get(STRICT_ENV, "0").lower() in ("1", "true", "yes")


def describe_error(exc: BaseException) -> str:
    """An exception as a record tells it: its type and message."""
    return f"{type(exc).__name__}: {exc}"
