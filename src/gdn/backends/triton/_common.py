"""What the bundled Triton kernels need to know about the Triton they run on: whether it interprets,
which distribution and target it is, the device to launch on, and launch sizes.

Nothing here imports triton at module import time, so the backend can be listed (and rejected with
a reason) where triton is absent."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

import torch

INTERPRET_ENV = "TRITON_INTERPRET"
# triton-ascend installs the `triton` import package under its own distribution name.
_DISTRIBUTIONS = ("triton-ascend", "triton")


def is_interpreting() -> bool:
    """Whether @triton.jit builds interpreted kernels (TRITON_INTERPRET=1: numpy on the host).

    Triton reads the variable when a kernel is decorated, so it must be set before the kernel
    modules are imported. Triton with `triton.knobs` (3.6, 3.9) also accepts true/on/yes, 3.2 only
    "1": ask the installed Triton when it can, so that this agrees with what the kernels became."""
    try:
        from triton import knobs
    except ImportError:
        return os.environ.get(INTERPRET_ENV, "0") == "1"
    return bool(knobs.runtime.interpret)


def accept_runtime_loop_bounds() -> None:
    """Lets the interpreter of Triton < 3.9 run a loop whose bound the kernel computed (a sequence's
    chunk count, read from cu_seqlens). It converts the bound with int() of a one-element array, which
    numpy 2.4 rejects; Triton 3.9 squeezes the array first, and so does the conversion this installs.
    Without it each such loop would need a second form for the interpreter."""
    import triton
    from packaging.version import Version

    if Version(triton.__version__).release >= (3, 9):
        return
    from triton.runtime import interpreter

    # a build without that hook (a fork's interpreter) keeps its own conversion
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, "squeezes_index", False):
        return

    def index(self) -> int:
        return int(self.handle.data.squeeze())

    # Triton 3.2 patches tensor attributes directly, 3.6 through a scope that restores them after
    # the launch (in reverse order, so the original comes back).
    def patch_lang_tensor(tensor, *scope) -> None:
        patch_tensor(tensor, *scope)
        if scope:
            scope[0].set_attr(tensor, "__index__", index)
        else:
            tensor.__index__ = index

    patch_lang_tensor.squeezes_index = True
    interpreter._patch_lang_tensor = patch_lang_tensor


@dataclass(frozen=True)
class OpKernel:
    """An op as the kernel module that serves it declares it in its `OPS` (TritonBackend.loader reads
    every module's): the function taking the validated call, and what the backend says of it."""

    implementation: Callable
    # no backward: the op is probed without gradients and its calls that need them run eager
    # (gdn.resolve.Resolution.serve)
    forward_only: bool = False
    # the kernel checks the index and offset values on the device (Backend.guards_values)
    guards_values: bool = False
    # the numeric probe's bound on ||out - eager|| / ||eager|| at fp32 (None: the probe's default)
    probe_tolerance: float | None = None


@dataclass(frozen=True)
class Flavour:
    """The installed Triton: its distribution (`triton` or `triton-ascend`), version and, unless
    interpreting, the backend of the active driver's target ("cuda", "hip", "npu")."""

    distribution: str
    version: str
    target: str | None

    def describe(self) -> str:
        where = "interpreter" if self.target is None else f"target {self.target}"
        return f"{self.distribution} {self.version} ({where})"


def flavour() -> Flavour:
    """Raises ImportError when triton is missing and whatever the driver raises when no device
    backend is usable (both are reasons for the resolver, never crashes)."""
    import triton

    distribution = next((d for d in _DISTRIBUTIONS if _installed(d)), "triton")
    target = None if is_interpreting() else triton.runtime.driver.active.get_current_target().backend
    return Flavour(distribution, triton.__version__, target)


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def device_guard(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """Triton launches on the current device of the torch device module, not on the tensor's: make
    the tensor's device current for the launch (a no-op for host tensors under the interpreter)."""
    device = t.device
    if device.type == "cpu":
        return _SAME_DEVICE
    module = torch.get_device_module(device.type)
    # Entering and leaving the device context costs a decode step more host time than the check.
    if module.current_device() == device.index:
        return _SAME_DEVICE
    return module.device(device)


_SAME_DEVICE = contextlib.nullcontext()


@functools.cache
def processors(device: torch.device) -> int:
    """Streaming multiprocessors (or cores) of the device: how many programs run at once, roughly;
    1 for the interpreter, which runs one program at a time and is fastest with few, wide ones."""
    if device.type == "cpu":
        return 1
    props = torch.get_device_module(device.type).get_device_properties(device)
    return getattr(props, "multi_processor_count", 0) or 64


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_warps_for(tile_elements: int) -> int:
    """Memory-bound tiles: about 1024 elements per warp (32 per thread and operand, in registers),
    between 1 and 8 warps."""
    return max(1, min(8, tile_elements // 1024))
