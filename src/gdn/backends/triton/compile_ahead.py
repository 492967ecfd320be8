"""Compiling a call's binaries ahead of its first launch, all at once and in parallel.

A chunk forward+backward launches nine or ten kernels; compiled one at a time as each is first launched, a
fresh process pays their compile times in sequence (about 0.7 s each on an H200 host, most of it in
ptxas and the C compiler that builds each binary's launcher, both separate processes). Here the
call's host code runs once in a dry mode where every launch only compiles (Triton's warm-up), under
Triton's asynchronous compile mode on a thread pool, and each binary's launcher is built on the same
pool as soon as the binary is compiled; the real call then finds everything compiled.

A dry run is made once per kernel class (what decides the binaries: dtypes, head counts and dims, the
variant flags), never per length; several classes can be compiled in one batch (the numeric probe hands
over all its cases at once). Where Triton has no asynchronous compile mode (3.2) or interprets
(nothing to compile), the dry run is skipped and kernels compile at their first launch, as before."""

from __future__ import annotations

import contextvars
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


def _build_launcher(kernel: Any) -> None:
    """Build (and leave in Triton's cache) the launcher the binary's first launch would build; the
    launch then loads it from the cache."""
    from triton.runtime import driver

    driver.active.launcher_cls(kernel.src, kernel.metadata)


def _build_launcher_once_compiled(compiling: Future) -> None:
    _build_launcher(compiling.result())


def dry_run(fn: Callable[[], object]) -> None:
    """Run `fn` with every launch through `launch` compiling only (no kernel runs; outputs stay unwritten)."""
    token = _compiling_only.set(True)
    try:
        fn()
    finally:
        _compiling_only.reset(token)


def compile_ahead(dry_runs: Mapping[Hashable, Callable[[], object]]) -> None:
    """Once per key: the dry runs of the keys not done before, all under one asynchronous compile
    mode, so that every binary they launch (and its launcher) compiles in parallel with the others."""
    if all(key in _done for key in dry_runs):
        return
    with _lock:
        todo = {key: fn for key, fn in dry_runs.items() if key not in _done}
        mode_type = _async_compile_mode()
        if todo and mode_type is not None:
            with ThreadPoolExecutor(_workers(), thread_name_prefix="gdn-compile") as pool:
                with mode_type(pool) as mode:
                    for fn in todo.values():
                        dry_run(fn)
                    # Each binary's launcher builds (a C compiler, another process) as soon as the binary
                    # is compiled, beside the compiles still running. Queued after every compile, each
                    # waits only on a compile a worker has taken. The mode's futures are read here: Triton
                    # 3.9 drops them when the mode ends.
                    launchers = [pool.submit(_build_launcher_once_compiled, f) for f in list(mode.raw_futures)]
                for launcher in launchers:
                    launcher.result()
        _done.update(todo)
