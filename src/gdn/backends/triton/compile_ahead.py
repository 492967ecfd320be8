"""Compiling a call's binaries ahead of its first launch, all at once and in parallel.

A chunk forward+backward launches nine or ten kernels; compiled one at a time as each is first launched, a
fresh process pays their compile times in sequence (about 0.7 s each on an H200 host, most of it in
ptxas and the C compiler that builds each binary's launcher, both separate processes). Here the
call's host code runs once in a dry mode where every launch only compiles (Triton's warm-up), under
Triton's asynchronous compile mode; once every dry run of the batch has handed over its compiles, they
start together on a thread pool, and each binary's launcher is built on the same pool beside its
compile (from the kernel's signature, which is all a launcher's source depends on where the binary
uses no tensor descriptors, as none of gdn's does), or where that source cannot be had before the
compile, as soon as the binary is compiled. The real call then finds everything compiled, and the
batch takes about its longest compile (built after its binary, that compile's launcher, a C compiler
run of 0.3-1 s, added its own time).

A dry run is made once per kernel class (what decides the binaries: dtypes, head counts and dims, the
variant flags), never per length; several classes can be compiled in one batch (the numeric probe hands
over all its cases at once). Where Triton has no asynchronous compile mode (3.2) or interprets
(nothing to compile), the dry run is skipped and kernels compile at their first launch, as before."""

from __future__ import annotations

import contextvars
import functools
import os
import threading
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from gdn.backends.triton._common import is_interpreting

_compiling_only: contextvars.ContextVar[bool] = contextvars.ContextVar("gdn_compiling_only", default=False)
_done: set[Hashable] = set()
_lock = threading.Lock()


def compiling_only() -> bool:
    """Whether a dry run is under way: launches then only compile (gdn.backends.triton.launch)."""
    return _compiling_only.get()


def _async_compile_mode() -> type | None:
    """Triton's asynchronous compile mode (Triton >= 3.4), or None where there is nothing to gain."""
    if is_interpreting():
        return None
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return None
    return AsyncCompileMode


def supported() -> bool:
    """Whether calls here compile their binaries ahead (Triton >= 3.4 on a device)."""
    return _async_compile_mode() is not None


def _workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _build_launcher(source: Any, metadata: Any) -> None:
    """Build (and leave in Triton's cache) the launcher the binary's first launch would build; the
    launch then loads it from the cache."""
    from triton.runtime import driver

    driver.active.launcher_cls(source, metadata)


def _build_launcher_once_compiled(compiling: Future) -> None:
    kernel = compiling.result()
    _build_launcher(kernel.src, kernel.metadata)


class _MetadataNotYet:
    """A binary's metadata before it is compiled, as its launcher's build reads it: no tensor
    descriptors; every other field only sets attributes of the launcher object, which is dropped."""

    def __getattr__(self, name: str) -> None:
        return None


@functools.cache
def _launchers_compile() -> bool:
    """Whether this Triton's launcher compiles a module per signature (3.4-3.6 run a C compiler; later
    releases launch through one generic launcher, and there is nothing to build ahead)."""
    from triton.runtime import driver

    return "compile_module_from_src" in driver.active.launcher_cls.__init__.__code__.co_names


def _source_of(compile_fn: Callable[[], object]) -> Any | None:
    """The kernel source a compile is about to lower: Triton's jit hands the compile mode a closure over
    it. None where it does not (the launcher is then built once the binary is)."""
    from triton.compiler import ASTSource

    for cell in getattr(compile_fn, "__closure__", None) or ():
        if isinstance(cell.cell_contents, ASTSource):
            return cell.cell_contents
    return None


class _FrontEndsInTurn:
    """Lets the compiles of a batch run their front ends (Triton's code generator from the kernel's
    Python source, which holds the interpreter's lock throughout) one at a time, in the order the
    compiles started, while the lowering of those past it runs in parallel. Started together, eleven
    front ends shared the lock round-robin and each took about 1 s on an H200 host (0.15-0.2 s alone),
    the longest compile's too, whose end is the batch's. A compile that ends without its front end
    (Triton's cache had the binary, or it failed) gives up its turn as it ends."""

    def __init__(self, count: int):
        self.ready = threading.Condition()
        self.done = [False] * count
        self.turn = 0

    def gate(self, rank: int, make_ir: Callable[..., object]) -> Callable[..., object]:
        def in_turn(*args: object, **kwargs: object) -> object:
            with self.ready:
                self.ready.wait_for(lambda: self.turn >= rank)
            try:
                return make_ir(*args, **kwargs)
            finally:
                self.finish(rank)

        return in_turn

    def finish(self, rank: int) -> None:
        with self.ready:
            self.done[rank] = True
            while self.turn < len(self.done) and self.done[self.turn]:
                self.turn += 1
            self.ready.notify_all()


def _settle(future: Future, compile_fn: Callable[[], object], turns: _FrontEndsInTurn, rank: int, source: Any) -> None:
    try:
        future.set_result(compile_fn())
    except BaseException as error:  # the compile mode's wait raises it
        future.set_exception(error)
    finally:
        turns.finish(rank)
        if source is not None:  # the binary keeps its source: without the batch's gate
            vars(source).pop("make_ir", None)


class _HeldCompiles:
    """The executor a compile mode is given. It holds each compile until every dry run of the batch is
    done, then starts them all at once, each with its launcher built beside it where the compile's
    source can be read before it runs, else once the binary is compiled. Started as they came, the
    compiles' own Python held the interpreter's lock against the dry run still issuing the later ones
    (the WY backward's compile, the longest, began about 0.4 s into the batch on an H200 host)."""

    def __init__(self, pool: ThreadPoolExecutor):
        self.pool = pool
        self.held: list[tuple[Future, Callable[[], object]]] = []

    def submit(self, compile_fn: Callable[[], object]) -> Future:
        """What Triton's compile mode calls with each compile (a closure over the kernel's source)."""
        future: Future = Future()
        self.held.append((future, compile_fn))
        return future

    def start(self) -> list[Future]:
        """Start the held compiles, the longest kernel source first, their front ends in that order
        (_FrontEndsInTurn), and their launchers' builds; the builds' futures. The batch lasts as long
        as its longest compile, and the source's length ranks the chunk op's compile times (the WY
        backward's 6.8 kB, then prepare's 6.0 kB, take the longest; the l2norm's 1.3 kB the shortest)."""
        sources = {id(compile_fn): _source_of(compile_fn) for _, compile_fn in self.held}
        self.held.sort(key=lambda held: -len(getattr(getattr(sources[id(held[1])], "fn", None), "src", "")))
        turns = _FrontEndsInTurn(len(self.held))
        for rank, (future, compile_fn) in enumerate(self.held):
            source = sources[id(compile_fn)]
            if source is not None:  # the compile calls its source's make_ir: this source's, in turn
                source.make_ir = turns.gate(rank, source.make_ir)
            self.pool.submit(_settle, future, compile_fn, turns, rank, source)
        early = _launchers_compile() if self.held else False
        launchers = []
        for future, compile_fn in self.held:
            source = sources[id(compile_fn)] if early else None
            if source is None:  # queued after every compile: it waits only on a compile a worker has taken
                launchers.append(self.pool.submit(_build_launcher_once_compiled, future))
            else:
                launchers.append(self.pool.submit(_build_launcher, source, _MetadataNotYet()))
        self.held = []
        return launchers


def dry_run(fn: Callable[[], object]) -> None:
    """Run `fn` with every launch through `launch` compiling only (no kernel runs; outputs stay unwritten)."""
    token = _compiling_only.set(True)
    try:
        fn()
    finally:
        _compiling_only.reset(token)


def compile_ahead(
    dry_runs: Mapping[Hashable, Callable[[], object]], meanwhile: Callable[[], object] | None = None
) -> None:
    """Once per key: the dry runs of the keys not done before, all under one asynchronous compile
    mode, so that every binary they launch (and its launcher) compiles in parallel with the others.
    `meanwhile` runs on this thread once the compiles have started (or at once where there is nothing
    to compile): work that needs none of them, such as the numeric probe's eager references."""
    todo = {key: fn for key, fn in dry_runs.items() if key not in _done}
    mode_type = _async_compile_mode() if todo else None
    if mode_type is None:
        _done.update(todo)
        if meanwhile is not None:
            meanwhile()
        return
    with _lock:
        todo = {key: fn for key, fn in dry_runs.items() if key not in _done}
        with ThreadPoolExecutor(_workers(), thread_name_prefix="gdn-compile") as pool:
            compiles = _HeldCompiles(pool)
            with mode_type(compiles):
                try:
                    for fn in todo.values():
                        dry_run(fn)
                finally:  # the mode waits on every compile it was handed when it ends
                    launchers = compiles.start()
                if meanwhile is not None:
                    meanwhile()
            for launcher in launchers:
                launcher.result()
        _done.update(todo)
