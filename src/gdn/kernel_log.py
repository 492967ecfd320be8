"""What ran, call by call: a process-wide log of the kernel each op call reached at every dispatch level.

A backend's name is not what runs: gdn hands a call its backend refuses to the next candidate, and a
peer dispatches again inside itself, per call and by the call's dtype (fla's registry sends
`gated_delta_rule.chunk_gated_delta_rule` to FlashQLA for bf16 and to its own Triton function for fp32,
and in that function's backward `common.chunk_bwd_dqkwg` to TileLang where TileLang is installed). So
the log keeps one entry per (level, function, dtype, what ran, the candidates passed over), counted:
level "gdn" for gdn's own choice per op call (`record_route`, which also keeps the route that served
the thread's latest call: `last_route`), and the peer's name for the dispatch inside it (its adapter
watches it: `Backend.watch`).

Off by default: an op call then pays one attribute read. The matrix turns it on while a cell runs its
test families, its accuracy table and its benchmark (gdn.matrix.kernels). Backward passes run on
autograd's own threads, so the log is one per process, not per thread, and what a span of time ran is
read as the difference of two marks (`mark`, `since`).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # gdn.matrix's cell entry imports this module where torch may be broken
    import torch

# the candidates that declined a call before the one that ran it: (backend, why) pairs
PassedOver = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class KernelEntry:
    """One kind of call: at `level` ("gdn", or a peer such as "fla"), `function` (a gdn op, or the
    peer's operation.function) with inputs of `dtype` ran `ran` (a gdn route, or the peer's backend),
    after the candidates in `passed_over` declined it; `during` says what the process was doing when
    not serving a user's call (gdn's numeric probe of a backend: "numeric probe of fla")."""

    level: str
    function: str
    dtype: str
    ran: str
    passed_over: PassedOver = ()
    during: str | None = None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class KernelLog:
    """Counts of KernelEntry, safe to note from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[KernelEntry] = Counter()

    def note(self, entry: KernelEntry) -> None:
        with self._lock:
            self._counts[entry] += 1

    def mark(self) -> Counter[KernelEntry]:
        """The counts so far, to subtract later (`since`)."""
        with self._lock:
            return Counter(self._counts)

    def since(self, mark: Counter[KernelEntry]) -> Counter[KernelEntry]:
        """What was noted after `mark` was taken."""
        with self._lock:
            return self._counts - mark


# On a peer's function that a watcher (`Backend.watch`) put in its place: the peer's own function.
ORIGINAL = "__gdn_original__"

# The log in force (None: nothing is noted). Read without the lock on every op call.
ACTIVE: KernelLog | None = None
_install_lock = threading.Lock()
# What the process is doing besides serving calls (see KernelEntry.during): one value for the process,
# since a backward that a probe starts runs on autograd's threads.
_during: str | None = None


def install(log: KernelLog | None) -> KernelLog | None:
    """Make `log` the one in force (None turns logging off); returns the one it replaces."""
    global ACTIVE
    with _install_lock:
        previous, ACTIVE = ACTIVE, log
    return previous


def note(level: str, function: str, dtype: torch.dtype, ran: str, passed_over: PassedOver = ()) -> None:
    """Note one call in the log in force, if any."""
    log = ACTIVE
    if log is not None:
        log.note(KernelEntry(level, function, dtype_name(dtype), ran, passed_over, _during))


# the route that served this thread's (or asyncio task's) latest op call
_last_route: contextvars.ContextVar[str | None] = contextvars.ContextVar("gdn_last_route", default=None)


def record_route(route: str, op: str, dtype: torch.dtype, passed_over: PassedOver = ()) -> None:
    """Record `route` as the one that served this thread's latest call of `op` (inputs of `dtype`), and
    note the call at level "gdn" in the log in force: gdn.dispatch does once a call's value checks pass,
    and so does a caller that serves calls through a step it took from gdn.dispatch once (gdn.prepared's
    steps, PreparedPoolDecode)."""
    _last_route.set(route)
    if ACTIVE is not None:
        note("gdn", op, dtype, route, passed_over)


def last_route() -> str | None:
    """The route that served the latest op call in this thread or asyncio task (None before any)."""
    return _last_route.get()


@contextlib.contextmanager
def during(what: str) -> Iterator[None]:
    """Calls noted within the block were made while the process was doing `what`."""
    global _during
    previous, _during = _during, what
    try:
        yield
    finally:
        _during = previous
