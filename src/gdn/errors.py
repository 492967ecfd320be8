"""gdn's error for a backend that cannot serve, and strict mode, which turns a fallback into that
error. They sit below the resolver, so that backends raising them need not import it."""

from __future__ import annotations

import os

STRICT_ENV = "GDN_STRICT"


class GdnBackendError(RuntimeError):
    """A requested backend could not serve an op and strict mode forbids falling back."""


def strict() -> bool:
    """Whether GDN_STRICT=1: a backend that cannot serve raises GdnBackendError instead of falling back."""
    return os.environ.get(STRICT_ENV, "0").lower() in ("1", "true", "yes")
