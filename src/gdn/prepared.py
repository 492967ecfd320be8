"""The one step cache: calls that repeat an earlier validated call's metadata go straight to that call's
prepared step, for every op whose serving implementation offers one (`fn.prepare(call)`: the triton
pool update).

A decode step repeats one call's metadata every token. A call whose tensors match an earlier validated
call's in type, shape, dtype, device and strides, with the same options, under the same decision of the
resolver (the same object) and value-check mode, goes straight to that call's prepared step: no
validation, resolution or launch set-up again (on an H200's host those cost about as much as the
kernel's own launch). Only where the step's kernel checks the values itself (the pool indices), the
checks are not asked for on the host (GDN_VALUE_CHECKS=1), and no gradient is wanted; anything else
takes the full path (gdn.dispatch). gdn.ops.PreparedPoolDecode holds one such step for a serving loop
that prepares it itself."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gdn import _validate as check
from gdn import dispatch
from gdn.calls import SPECS
from gdn.kernel_log import record_route
from gdn.resolve import Resolution, decided
from gdn.tensor_metadata import SameMetadata, metadata

# the ops that may have a prepared step, and how many leading positional arguments are its tensors
# (a call that passes one of them by keyword takes the full path)
STEP_TENSORS = {spec.name: spec.step_tensors for spec in SPECS if spec.step_tensors}
# a step's other arguments (options) must be plain values: a tensor among them (cu_seqlens) is bound
# into the launch, so such a call takes the full path
_OPTION_TYPES = (bool, int, float, type(None))
MAX_STEPS = 64


@dataclass(frozen=True)
class Step:
    """A prepared step (None where the call has none) and what a call must repeat to take it: its
    tensors' metadata, its options (values and types: validation tells a flag from the integer 1), the
    value-check mode and the resolver's decision (held, so its identity is not reused while the step
    lives)."""

    same: SameMetadata
    options: tuple
    mode: str
    resolution: Resolution
    route: str | None
    run: Callable | None
    device_type: str  # the tensors' (same() checks the device): reading a tensor's device costs a µs


# a call's key -> the step of calls with that key: its metadata, options, value-check mode and the
# resolver's decision (by identity: a decision made again after a reset, a registration or under another
# mode is another object; a step holds its decision, so the identity is not reused while the step lives)
_steps: dict[tuple, Step] = {}
# op -> its latest step taken or stored: a serving loop repeats one call's metadata on every layer and
# token, and checking a call against it (SameMetadata) costs less than building and hashing its key
_latest: dict[str, Step] = {}
_steps_lock = threading.Lock()  # for the writers; a hit reads without it


def run_op(name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
    """The public op `name` outside a compiled graph: its prepared step where the call repeats one's
    metadata, else the full path (remembering the step for the calls that repeat this one's). What a
    call must repeat is read first, the resolver's decision once, then the metadata where the latest
    step is not repeated."""
    width = STEP_TENSORS.get(name)
    key = step = None
    if width is not None and len(args) >= width:
        tensors = args[:width]
        held = _options(args[width:], kwargs)
        mode = check.value_check_mode()
        latest = _latest.get(name)
        repeated = latest is not None and latest.same(*tensors) and held == latest.options and latest.mode == mode
        first = tensors[0]
        if repeated:  # its options are a stored step's: plain
            device_type = latest.device_type
        elif isinstance(first, torch.Tensor) and _plain(held):
            device_type = first.device.type
        else:  # no step: a call whose first argument is not a tensor fails validation
            device_type = None
        # before the op is resolved, the first call resolves it in its own class (gdn.resolve)
        resolution = None if device_type is None else decided(name, device_type)
        if repeated and latest.resolution is resolution:
            step = latest
        elif resolution is not None:
            key = (name, metadata(tensors), held, mode, id(resolution))
            step = _steps.get(key)
            if step is not None:
                _latest[name] = step
        # a stored step's metadata is of tensors (a call whose arguments are not tensors fails validation
        # before any step is stored)
        if (
            step is not None
            and step.run is not None
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        ):
            record_route(step.route, name, first.dtype)
            return step.run(*tensors)
    served = dispatch.serve(name, args, kwargs, prepare=key is not None and step is None)
    # a key without a step: remember this call's step (or that it has none) for the calls that repeat its
    # metadata, unless the op was decided anew since the key was taken (a reset in another thread)
    if key is not None and step is None and id(served.resolution) == key[-1]:
        stored = Step(SameMetadata(tensors), held, mode, served.resolution, served.route, served.step, device_type)
        with _steps_lock:
            if len(_steps) >= MAX_STEPS:
                del _steps[next(iter(_steps))]  # the oldest
            _steps[key] = _latest[name] = stored
    return served.run()


def _options(options: tuple, kwargs: dict[str, Any]) -> tuple:
    """A call's options as a step holds them: types, then values (a comparison meets a value only where
    the types agree: no tensor is compared with a number), positional then by keyword."""
    return (tuple(map(type, options)), tuple(map(type, kwargs.values())), options, tuple(kwargs.items()))


def _plain(held: tuple) -> bool:
    """Whether a call's options (as _options holds them) are all plain values, as a step's must be."""
    positional, by_keyword = held[0], held[1]
    return all(kind in _OPTION_TYPES for kind in positional) and all(kind in _OPTION_TYPES for kind in by_keyword)
