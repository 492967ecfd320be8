"""Every launch of a bundled kernel: `launch(kernel, grid)(*args, **kwargs)`.

Triton's own launch (`JITFunction.run`) binds the arguments, specializes each one, builds a cache key,
finds the binary and only then calls the binary's launcher. On an H200 host that took about 35 µs of
a B = 1 decode step whose kernel runs 8 µs (2026-12-01), and each of a chunk call's twenty launches
pays it. Here, once Triton has launched a kernel with a set of arguments, later launches whose key
matches call that binary's launcher directly, as Triton's path would have after finding it. The key is
the kernel, the current device, each tensor's dtype and address modulo 16, and every other argument's
type and value: finer than Triton's specialization (which reads a pointer's 16-byte alignment and an
integer's being 1, its divisibility by 16 and its width), so a binary is never reused for arguments
Triton would compile another one for; a new value of an integer only takes Triton's path once. It is
built in one plain loop: on that host each Python operation per argument counts.

A launch whose keyword arguments are fixed per configuration (the decode step's sixteen constexprs
and options) passes them as one `Constants` built once for that configuration: the key then holds that
object, hashed by identity, instead of each name, value and type.

Triton's launch hooks (a profiler's) still run: with one set, the launch goes through the binary's
own launch, which computes their metadata; with none (Triton 3.6 keeps empty hook chains there), the
launcher gets no hooks and no metadata to build. Triton's debug mode (read when a binary is first
found) keeps every launch on Triton's path. Launches go through Triton's path during a dry run (they
only compile), under the interpreter, for anything that is not a JITFunction (a test's recorder), and
on targets other than CUDA, where this path has not run on a device.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gdn.backends.triton._common import device_guard, flavour, is_interpreting
from gdn.backends.triton.compile_ahead import compiling_only

# "0" keeps every launch on Triton's own path (a switch for comparing the two, or for a Triton whose
# launcher this path does not fit).
DIRECT_ENV = "GDN_TRITON_DIRECT_LAUNCH"
# Distinct (kernel, device, specialization) entries kept; past it the table starts over.
DIRECT_LIMIT = 4096
# Binaries a prepared launch keeps under its tensors' alignments (a step sees a handful at most).
_PREPARED_LIMIT = 16


class Constants:
    """A launch's keyword arguments (constexprs and launch options) as one object: `launch(kernel, grid,
    constants)(*args)`. Equal only to itself, so keep one per configuration (a cache): a new object
    each launch is a new key, and such a launch takes Triton's path."""

    __slots__ = ("kwargs",)

    def __init__(self, **kwargs: Any) -> None:
        tensors = sorted(name for name, value in kwargs.items() if isinstance(value, torch.Tensor))
        if tensors:
            raise TypeError(f"Constants: {tensors} are tensors; a launch passes tensors by position")
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"Constants({self.kwargs})"


@dataclass(frozen=True)
class _Binary:
    """A compiled kernel, held as its launcher, function and metadata, and which of a launch's
    arguments its launcher takes, in its order: the positional ones at `positions` (None: all of them),
    then `keyword_values`, the values of its keyword ones (fixed: the key holds every keyword's value)."""

    compiled: Any
    launcher: Callable[..., Any]
    function: Any
    packed_metadata: Any
    stream: Callable[[int], Any]
    hooks: Any
    positions: tuple[int, ...] | None
    keyword_values: tuple

    def values(self, args: tuple) -> tuple:
        """A launch's arguments as the launcher takes them."""
        values = args if self.positions is None else tuple(args[i] for i in self.positions)
        return (*values, *self.keyword_values) if self.keyword_values else values

    def run(self, device: int, grid: tuple[int, ...], args: tuple) -> None:
        self.run_whole(device, whole_grid(grid), args)

    def hooked(self) -> bool:
        """Whether a launch hook is set (a profiler can set one at any time: read per launch)."""
        return _hooked(self.hooks.launch_enter_hook) or _hooked(self.hooks.launch_exit_hook)

    def run_whole(self, device: int, whole: tuple[int, int, int], args: tuple) -> None:
        """Launch on `device` with the grid in three dimensions: through the binary's own launch where a
        hook is set (it computes the hooks' metadata), else its launcher alone."""
        if self.hooked():
            self.compiled[whole](*self.values(args))
            return
        self.run_launcher(device, whole, args)

    def run_launcher(self, device: int, whole: tuple[int, int, int], args: tuple) -> None:
        """The launcher alone, no hooks. `args` may give a tensor's address (an integer) in its place,
        where the caller knows the tensor is on `device` (PreparedLaunch)."""
        self.launcher(
            *whole, self.stream(device), self.function, self.packed_metadata, None, None, None, *self.values(args)
        )


def whole_grid(grid: tuple[int, ...]) -> tuple[int, int, int]:
    """The grid in three dimensions: a binary's launch reads all three, Triton's own path fills them in."""
    return grid if len(grid) == 3 else (*grid, 1, 1)[:3]


_binaries: dict[tuple, _Binary | None] = {}
_SCALARS = frozenset((int, float, bool, str, type(None)))


def launch(kernel: Any, grid: tuple[int, ...], constants: Constants | None = None) -> Callable[..., Any]:
    """`kernel[grid]`, launched through its binary's launcher once Triton has launched it with arguments
    of the same key; during a dry run, the kernel's warm-up at that grid (compiles only). With
    `constants`, the launch takes its keyword arguments from them and no others."""
    fixed = {} if constants is None else constants.kwargs
    if compiling_only():
        return functools.partial(kernel.warmup, grid=grid, **fixed)
    if not direct_launches() or type(kernel) is not _jit_function():
        return functools.partial(kernel[grid], **fixed)
    if constants is None:
        return functools.partial(_launch, kernel, grid)
    return functools.partial(_launch_constants, kernel, grid, constants)


@functools.cache
def direct_launches() -> bool:
    """Whether launches skip Triton's per-launch path once a binary is known (CUDA, not interpreting,
    not switched off by GDN_TRITON_DIRECT_LAUNCH=0). Read once per process."""
    if is_interpreting() or os.environ.get(DIRECT_ENV, "1") == "0":
        return False
    try:
        return flavour().target == "cuda"
    except Exception:  # no usable driver: Triton's own path reports it at the launch
        return False


@functools.cache
def _jit_function() -> type:
    from triton.runtime.jit import JITFunction

    return JITFunction


class PreparedLaunch:
    """`launch(kernel, grid, constants)(*tensors, *tail)` for a launch that repeats with new tensors of
    the same dtypes on `device` (a prepared decode step): `prepared(*tensors)`. The callers guarantee
    both (they check the first launch's tensors, then each launch's through the tensors' guard, which
    reads dtype and device). Its binaries are `launch`'s (found under the key `launch` builds); once one
    is found it is also kept here under what can still change from launch to launch, each tensor's
    address modulo 16 (None for None), so a launch builds and hashes a key of its tensors' alignments
    only. A launch makes `device` current where it is not (the binary was loaded there).

    A known binary's launcher gets the tensors' addresses as integers: Triton's launcher takes an integer
    as the pointer itself, where for a tensor it calls `data_ptr()` and asks the driver whether the
    pointer is one the device can reach (cuPointerGetAttribute), once per pointer argument and launch.
    A launch hook (a profiler's) gets the tensors."""

    __slots__ = ("_direct", "_known", "_tail_key", "constants", "device", "grid", "kernel", "tail")

    def __init__(
        self, kernel: Any, grid: tuple[int, ...], constants: Constants, tail: tuple, device: torch.device
    ) -> None:
        self.kernel, self.constants, self.tail, self.device = kernel, constants, tail, device
        self.grid = whole_grid(grid)
        self._tail_key = _key(kernel, device.index, tail, constants.kwargs, constants)[3:]
        self._known: dict[tuple, _Binary] = {}
        self._direct = device.type == "cuda" and direct_launches() and type(kernel) is _jit_function()

    def __call__(self, *tensors: torch.Tensor | None) -> None:
        kernel, device = self.kernel, self.device
        if not self._direct or compiling_only():
            with device_guard(tensors[0]):
                launch(kernel, self.grid, self.constants)(*tensors, *self.tail)
            return
        current = torch.cuda.current_device()
        if current != device.index:
            with torch.cuda.device(device):
                self(*tensors)
            return
        addresses = [None if t is None else t.data_ptr() for t in tensors]
        found = tuple([None if a is None else a % 16 for a in addresses])
        binary = self._known.get(found)
        if binary is not None:
            if binary.hooked():
                binary.run_whole(current, self.grid, (*tensors, *self.tail))
            else:
                binary.run_launcher(current, self.grid, (*addresses, *self.tail))
            return
        args = (*tensors, *self.tail)
        full = (kernel, current, self.constants, *_key(kernel, current, tensors, {})[2:], *self._tail_key)
        binary = _binaries.get(full)
        if binary is None:
            _launch_keyed(kernel, self.grid, args, self.constants.kwargs, self.constants)
            binary = _binaries.get(full)
        else:
            binary.run_whole(current, self.grid, args)
        if binary is not None and len(self._known) < _PREPARED_LIMIT:
            self._known[found] = binary


def _launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    _launch_keyed(kernel, grid, args, kwargs, None)


def _launch_constants(kernel: Any, grid: tuple[int, ...], constants: Constants, *args: Any) -> None:
    _launch_keyed(kernel, grid, args, constants.kwargs, constants)


def _launch_keyed(
    kernel: Any, grid: tuple[int, ...], args: tuple, kwargs: dict[str, Any], constants: Constants | None
) -> None:
    device = torch.cuda.current_device()
    key = _key(kernel, device, args, kwargs, constants)
    try:
        binary = _binaries.get(key)
    except TypeError:  # an argument that cannot be hashed: this launch takes Triton's path
        binary = key = None
    if binary is not None:
        binary.run(device, grid, args)
        return
    # checked where no binary is known yet, so never on the hot path: a binary binds its keyword values,
    # and none is ever stored for a launch with a tensor among them
    if any(isinstance(value, torch.Tensor) for value in kwargs.values()):
        raise TypeError(f"{kernel.__name__}: pass tensors by position (the launch key reads only positional ones)")
    compiled = kernel[grid](*args, **kwargs)
    if key is not None and key not in _binaries:
        if len(_binaries) >= DIRECT_LIMIT:
            _binaries.clear()
        _binaries[key] = _binary(kernel, compiled, args, kwargs)


def _key(kernel: Any, device: int, args: tuple, kwargs: dict[str, Any], constants: Constants | None = None) -> tuple:
    """What decides the binary of this launch (the module's docstring says why each part); hashed only
    by the lookup, which takes an unhashable key as a launch for Triton's path. Keyword arguments go by
    name, value and type, or, from `constants`, as that object; tensors go by position (`_launch`
    refuses one by keyword, Constants hold none). An integer goes by its value alone: only integers
    put a bare integer where an argument's entries begin (a tensor puts its dtype first, any other
    value its type), so no other argument's entries can equal it. One plain loop: this runs on every
    launch."""
    if constants is None:
        key: list[Any] = [kernel, device, *kwargs.items(), *map(type, kwargs.values())]
    else:
        key = [kernel, device, constants]
    append = key.append
    for value in args:
        kind = type(value)
        if kind is int:
            append(value)
        elif kind is torch.Tensor or (kind not in _SCALARS and isinstance(value, torch.Tensor)):
            append(value.dtype)
            append(value.data_ptr() % 16)
        else:
            append(kind)
            append(value)
    return tuple(key)


def _binary(kernel: Any, compiled: Any, args: tuple, kwargs: dict[str, Any]) -> _Binary | None:
    """The launcher's argument order, read from the binary's signature (Triton 3.2 lists the runtime
    parameters there, later versions every parameter), or None where the direct path must not be used."""
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if signature is None or getattr(kernel, "pre_run_hooks", None) or _debugging():
        return None
    params = [p.name for p in kernel.params]
    positional = params[: len(args)]
    names = list(signature)
    positions = tuple(i for i, name in enumerate(positional) if name in signature)
    keywords = tuple(name for name in names if name not in positional)
    if [positional[i] for i in positions] + list(keywords) != names or not all(n in kwargs for n in keywords):
        return None
    keyword_values = tuple(kwargs[name] for name in keywords)
    return _Binary(
        compiled,
        compiled.run,
        compiled.function,
        compiled.packed_metadata,
        _stream_getter(),
        _hook_source(),
        None if len(positions) == len(args) else positions,
        keyword_values,
    )


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is set: Triton 3.2 keeps None or a callable, later versions a HookChain
    whose list of calls is empty until a profiler adds one."""
    return bool(getattr(hook, "calls", hook is not None))


def _stream_getter() -> Callable[[int], Any]:
    """The active driver's current stream of a device, as Triton's launch path reads it."""
    from triton.runtime import driver

    return driver.active.get_current_stream


def _hook_source() -> Any:
    """Where this Triton keeps its launch hooks: `triton.knobs.runtime` (3.4 on), CompiledKernel (3.2)."""
    try:
        from triton import knobs
    except ImportError:
        from triton.compiler import CompiledKernel

        return CompiledKernel
    return knobs.runtime


def _debugging() -> bool:
    """Triton's debug mode (checks compiled into each binary, chosen per launch): its path decides."""
    try:
        from triton import knobs
    except ImportError:  # Triton 3.2
        return os.environ.get("TRITON_DEBUG", "0") == "1"
    return bool(knobs.runtime.debug)
