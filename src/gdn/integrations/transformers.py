"""Route transformers' Qwen3.5 / Qwen3.5-MoE / Qwen3-Next GatedDeltaNet layers through gdn's ops.

    from gdn.integrations import transformers as gdn_transformers

    with gdn_transformers.patch(mode="triton"):   # or patch(...) ... unpatch()
        model(...)                                # chunk, decode, conv1d fn/update run on gdn

transformers has two ways of reaching the kernels, and `patch` detects which one each class uses
from its code rather than from a version table:

- up to 5.14 `__init__` stores them on the instance (`self.chunk_gated_delta_rule`, ...): the patch
  puts a data descriptor for each name on the class. A class-level data descriptor wins over the
  instance dict, so models built before the patch are served too, and `__init__`'s assignments
  during the patch land in the instance dict, where they are found again after `unpatch`.
- from 5.15 `forward` calls module-level functions (`torch_chunk_gated_delta_rule`, ...): the patch
  replaces those names in the modeling module, which `forward` looks up on every call. From 5.25 it
  reaches the conv ones through another module function (`causal_conv1d_forward`, which also keeps
  the conv state in the cache) that looks them up in the same namespace; with the `kernels` package
  installed these are `nn.Module` instances wrapping the functions, and the detection looks inside.

In both, the class's `forward` is wrapped to tell the ops which module instance is calling (for the
record) and the packed-sequence offsets `cu_seq_lens_q` it was given: transformers hands them to the
chunk op, but the conv needs them too (as `seq_idx`) to keep packed sequences apart, and up to 5.14
never sees them. Layers older than about 5.12 take no such kwargs at all: they cannot keep packed
sequences apart, and the record says so (`packed_sequences`).

With `mode=None` the ops resolve under the process-wide gdn compute mode; an explicit mode applies
to the patched calls only (`gdn.resolve.compute_mode_override`), never to other gdn calls.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import inspect
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from packaging.version import Version

import gdn
from gdn import resolve as gdn_resolve
from gdn.calls import SPECS

MIN_TRANSFORMERS = "5.2"  # the first release with Qwen3.5

# Supported class -> its modeling module (relative to transformers.models).
CLASSES = {
    "Qwen3_5GatedDeltaNet": "qwen3_5.modeling_qwen3_5",
    "Qwen3_5MoeGatedDeltaNet": "qwen3_5_moe.modeling_qwen3_5_moe",
    "Qwen3NextGatedDeltaNet": "qwen3_next.modeling_qwen3_next",
}
API_ATTRIBUTES = "module-attributes"
API_FUNCTIONS = "module-functions"
# gdn op -> (instance attribute up to 5.14, module-level function from 5.15).
KERNELS = {spec.name: spec.transformers for spec in SPECS if spec.transformers is not None}
# The model kwarg carrying packed-sequence offsets, as transformers' flash-attention path names it.
PACKED_OFFSETS = "cu_seq_lens_q"
_ABSENT = object()


class UnsupportedTransformersError(RuntimeError):
    """The installed transformers, or one of its GDN classes, is not one this integration can patch."""


# --- the ops as transformers calls them ----------------------------------------------------------


@dataclass(frozen=True)
class _Caller:
    module: torch.nn.Module
    class_name: str
    cu_seqlens: torch.Tensor | None


_caller: contextvars.ContextVar[_Caller | None] = contextvars.ContextVar("gdn_transformers_caller", default=None)


def _run(op: str, *args: Any, **kwargs: Any) -> Any:
    state = _active
    mode = None if state is None else state.mode
    scope = contextlib.nullcontext() if mode is None else gdn_resolve.compute_mode_override(mode)
    with scope:
        out = getattr(gdn, op)(*args, **kwargs)
    if state is not None:
        state.tally(_caller.get(), op, gdn_resolve.last_route())
    return out


def _delta_rule(op: str) -> Callable:
    """The adapter transformers calls for `op` (the chunk op or the recurrent decode), named as the
    layer's attribute (the op spec's transformers names)."""

    # From 5.15 transformers forwards its remaining attention kwargs (cu_seq_lens_k, max_length_q, ...)
    # to the GDN kernels, as it would to fla's, which ignore them; so does this. q and k come repeated
    # to the value heads (up to 5.17 at least) or at the key heads (5.24): the gdn contract takes both,
    # as H = HV or as grouped value heads.
    def adapter(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        *,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        **_attention_kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return _run(
            op,
            query,
            key,
            value,
            g,
            beta=beta,
            initial_state=initial_state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )

    adapter.__name__ = adapter.__qualname__ = KERNELS[op][0]
    return adapter


chunk_gated_delta_rule = _delta_rule("chunk_gated_delta_rule")
recurrent_gated_delta_rule = _delta_rule("fused_recurrent_gated_delta_rule")


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    seq_idx: torch.Tensor | None = None,
    **_attention_kwargs: Any,
) -> torch.Tensor:
    if seq_idx is None:
        seq_idx = _seq_idx(_caller.get(), x)
    return _run("causal_conv1d_fn", x, weight, bias, activation=activation, seq_idx=seq_idx)


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    return _run("causal_conv1d_update", x, conv_state, weight, bias, activation)


def _seq_idx(caller: _Caller | None, x: torch.Tensor) -> torch.Tensor | None:
    """The sequence index of every token of a packed row [1, D, T], from the offsets the layer got."""
    if caller is None or caller.cu_seqlens is None:
        return None
    cu = caller.cu_seqlens.to(x.device)
    ids = torch.arange(cu.numel() - 1, device=x.device, dtype=torch.int32)
    return torch.repeat_interleave(ids, cu.diff()).unsqueeze(0)


ADAPTERS: dict[str, Callable] = {
    "chunk_gated_delta_rule": chunk_gated_delta_rule,
    "fused_recurrent_gated_delta_rule": recurrent_gated_delta_rule,
    "causal_conv1d_fn": causal_conv1d_fn,
    "causal_conv1d_update": causal_conv1d_update,
}


class _KernelSlot:
    """A class-level data descriptor standing in for a kernel the class stores per instance."""

    def __init__(self, name: str, adapter: Callable):
        self.name = name
        self.adapter = adapter

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        return self if obj is None else self.adapter

    def __set__(self, obj: object, value: Any) -> None:
        obj.__dict__[self.name] = value

    def __delete__(self, obj: object) -> None:
        del obj.__dict__[self.name]


def _attributing(forward: Callable, class_name: str) -> Callable:
    @functools.wraps(forward)
    def patched_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        token = _caller.set(_Caller(self, class_name, kwargs.get(PACKED_OFFSETS)))
        try:
            return forward(self, *args, **kwargs)
        finally:
            _caller.reset(token)

    return patched_forward


# --- finding and patching the classes ------------------------------------------------------------


def _qualified(owner: type | ModuleType, name: str) -> str:
    if isinstance(owner, ModuleType):
        return f"{owner.__name__}.{name}"
    return f"{owner.__module__}.{owner.__qualname__}.{name}"


@dataclass
class _Replacement:
    owner: type | ModuleType
    name: str
    new: Any
    purpose: str  # for the record: the gdn op it routes to, or why it was wrapped
    old: Any = _ABSENT

    def apply(self) -> None:
        self.old = vars(self.owner).get(self.name, _ABSENT)
        setattr(self.owner, self.name, self.new)

    def revert(self) -> None:
        if self.old is _ABSENT:
            delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.old)

    def still_ours(self) -> bool:
        return vars(self.owner).get(self.name, _ABSENT) is self.new


@dataclass
class _ClassPatch:
    name: str
    modeling: ModuleType
    api: str
    packed_sequences: bool  # whether the layer gets the offsets of packed sequences at all (>= ~5.12)
    replacements: list[_Replacement]
    calls: Counter = field(default_factory=Counter)  # (op, route) -> calls, every instance
    instances_seen: int = 0

    def record(self) -> dict[str, Any]:
        return {
            "module": self.modeling.__name__,
            "api": self.api,
            "packed_sequences": self.packed_sequences,
            "replaced": {_qualified(r.owner, r.name): r.purpose for r in self.replacements},
            "calls": _nested(self.calls),
            "instances_seen": self.instances_seen,
        }


def _nested(calls: Counter) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (op, route), n in sorted(calls.items()):
        out.setdefault(op, {})[route] = n
    return out


def _code_words(fn: Callable, module: ModuleType | None = None) -> set[str]:
    """The global and attribute names and the string constants used by `fn` and by every function it
    wraps, and, given `module`, by every function of that module they name, transitively: from 5.25
    `forward` reaches the conv kernels through a module-level helper (`causal_conv1d_forward`), which
    looks them up in the same namespace the patch replaces them in. Decorators do not all set
    __wrapped__ (transformers 5.14's force_accelerate_hooks does not), so the functions held in closures
    are searched too."""
    names: set[str] = set()
    pending, seen = [fn], set()
    while pending:
        f = _function_of(pending.pop())
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        found = {*f.__code__.co_names, *(c for c in f.__code__.co_consts if isinstance(c, str))}
        names |= found
        pending.extend(cell.cell_contents for cell in f.__closure__ or () if _has_contents(cell))
        pending.extend(w for w in (getattr(f, "__wrapped__", None),) if w is not None)
        if module is not None:
            pending.extend(g for g in (vars(module).get(n) for n in found) if _defined_in(g, module))
    return names


def _function_of(obj: Any) -> Any:
    """The Python function that runs when `obj` is called, or None. With the `kernels` package
    installed, transformers' hub-kernel decorators turn module functions into `nn.Module` instances
    whose `forward` closes over the original function."""
    if inspect.isfunction(obj):
        return obj
    if inspect.ismethod(obj):
        return obj.__func__
    call = getattr(type(obj), "forward" if isinstance(obj, torch.nn.Module) else "__call__", None)
    return call if inspect.isfunction(call) else None


def torch_function(obj: Any) -> Any:
    """transformers' own torch code behind a kernel's name in a modeling module (a reference to compare
    with, or to time): without functools' wrappers (`__wrapped__`; from 5.15 the one that hands the work
    to fla or causal-conv1d where they import) and, with the `kernels` package installed, without the
    `nn.Module` it makes of a hub-kernel function, whose `forward` closes over the function."""
    found = inspect.unwrap(obj)
    while isinstance(found, torch.nn.Module):
        forward = getattr(type(found), "forward", None)
        cells = getattr(forward, "__closure__", None) or ()
        held = [c.cell_contents for c in cells if _has_contents(c) and inspect.isfunction(c.cell_contents)]
        if len(held) != 1:
            raise UnsupportedTransformersError(
                f"gdn.integrations.transformers: cannot find the function that {type(found).__qualname__} "
                f"wraps ({len(held)} candidates in its forward)"
            )
        found = inspect.unwrap(held[0])
    return found


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _defined_in(fn: Any, modeling: ModuleType) -> bool:
    return callable(fn) and not isinstance(fn, type) and getattr(fn, "__module__", None) == modeling.__name__


def _api_of(cls: type, modeling: ModuleType, version: str) -> str:
    forward_names = _code_words(cls.forward, modeling)
    attributes = [names[0] for names in KERNELS.values()]
    functions = [names[1] for names in KERNELS.values()]
    if set(functions) <= forward_names and all(callable(getattr(modeling, n, None)) for n in functions):
        return API_FUNCTIONS
    if set(attributes) <= forward_names & _code_words(cls.__init__):
        return API_ATTRIBUTES
    raise UnsupportedTransformersError(
        f"gdn.integrations.transformers: transformers {version}: {cls.__name__}.forward reaches neither the "
        f"module functions {functions} nor the instance attributes {attributes}; gdn does not know how to "
        "patch this version's GDN layer"
    )


def _transformers_version() -> str:
    try:
        import transformers
    except ImportError as exc:
        raise UnsupportedTransformersError(f"gdn.integrations.transformers: cannot import transformers: {exc}") from exc
    version = transformers.__version__
    if Version(version) < Version(MIN_TRANSFORMERS):
        raise UnsupportedTransformersError(
            f"gdn.integrations.transformers: transformers {version} is not supported (needs >= {MIN_TRANSFORMERS}, "
            "the first release with Qwen3.5)"
        )
    return version


def _plan(name: str, version: str) -> _ClassPatch:
    try:
        modeling = importlib.import_module(f"transformers.models.{CLASSES[name]}")
        cls = getattr(modeling, name)
    except (ImportError, AttributeError) as exc:
        raise UnsupportedTransformersError(
            f"gdn.integrations.transformers: transformers {version} has no {name} ({exc})"
        ) from exc
    api = _api_of(cls, modeling, version)
    replacements = [_Replacement(cls, "forward", _attributing(cls.forward, name), "wrapped: names the calling module")]
    for op, (attribute, function) in KERNELS.items():
        if api == API_FUNCTIONS:
            replacements.append(_Replacement(modeling, function, ADAPTERS[op], f"gdn.{op}"))
        else:
            replacements.append(_Replacement(cls, attribute, _KernelSlot(attribute, ADAPTERS[op]), f"gdn.{op}"))
    # Older layers take no attention kwargs: packed sequences never reach them as such.
    packed = PACKED_OFFSETS in _code_words(cls.forward)
    return _ClassPatch(name, modeling, api, packed, replacements)


# --- the patch state -----------------------------------------------------------------------------


@dataclass(eq=False)
class _State:
    version: str
    mode: str | None
    classes: dict[str, _ClassPatch]
    active: bool = True
    # Live module instance -> (its class name, (op, route) -> calls); weak, so that a patch never
    # keeps a model alive.
    instances: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tally(self, caller: _Caller | None, op: str, route: str) -> None:
        if caller is None:
            return  # a patched function called outside a GDN layer's forward: nothing to attribute it to
        with self.lock:
            patch = self.classes[caller.class_name]
            patch.calls[(op, route)] += 1
            if caller.module not in self.instances:
                self.instances[caller.module] = (caller.class_name, Counter())
                patch.instances_seen += 1
            self.instances[caller.module][1][(op, route)] += 1

    def record(self) -> dict[str, Any]:
        with self.lock:
            modules = [
                {
                    "class": class_name,
                    "layer_idx": getattr(module, "layer_idx", None),
                    "id": id(module),
                    "calls": _nested(calls),
                }
                for module, (class_name, calls) in self.instances.items()
            ]
            return {
                "integration": "transformers",
                "transformers": self.version,
                "mode": self.mode,
                "active": self.active,
                "classes": {name: patch.record() for name, patch in self.classes.items()},
                "modules": modules,
            }


_lock = threading.RLock()
_active: _State | None = None


class Patch:
    """A handle on a patch: `record()` stays readable after unpatching; as a context manager it
    unpatches on exit when this call was the one that patched."""

    def __init__(self, state: _State, owner: bool):
        self._state = state
        self._owner = owner

    def record(self) -> dict[str, Any]:
        return self._state.record()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        with _lock:
            if self._owner and _active is self._state:
                unpatch()


def patch(mode: str | None = None, classes: Iterable[str] | None = None) -> Patch:
    """Route the GDN layers of `classes` (default: all of CLASSES) through gdn's ops under `mode`
    (None: the process-wide gdn compute mode). Patching again with the same arguments does nothing;
    with different ones it is an error (unpatch first). Raises UnsupportedTransformersError when the
    installed transformers or one of the classes cannot be patched; nothing is changed then."""
    global _active
    if mode is not None and mode not in gdn.modes():
        raise ValueError(
            f"gdn.integrations.transformers.patch: mode expected one of {gdn.modes()} or None, got {mode!r}"
        )
    if isinstance(classes, str):
        classes = [classes]
    names = list(CLASSES) if classes is None else list(dict.fromkeys(classes))
    unknown = [n for n in names if n not in CLASSES]
    if unknown or not names:
        raise ValueError(
            f"gdn.integrations.transformers.patch: classes expected a non-empty subset of {list(CLASSES)}, got {names}"
        )
    with _lock:
        if _active is not None:
            if _active.mode == mode and set(_active.classes) == set(names):
                return Patch(_active, owner=False)
            raise RuntimeError(
                f"gdn.integrations.transformers.patch: already patched with mode={_active.mode!r} for "
                f"{sorted(_active.classes)}; call unpatch() before patching with mode={mode!r} for {sorted(names)}"
            )
        version = _transformers_version()
        plans = {name: _plan(name, version) for name in names}  # every check before any change
        for plan in plans.values():
            for replacement in plan.replacements:
                replacement.apply()
        _active = _State(version, mode, plans)
        return Patch(_active, owner=True)


def unpatch() -> None:
    """Restore everything `patch` replaced. Does nothing when not patched. Raises, changing nothing,
    when something else has replaced one of gdn's replacements since (restoring would drop it)."""
    global _active
    with _lock:
        if _active is None:
            return
        replacements = [r for plan in _active.classes.values() for r in plan.replacements]
        foreign = [f"{getattr(r.owner, '__name__', r.owner)}.{r.name}" for r in replacements if not r.still_ours()]
        if foreign:
            raise RuntimeError(
                f"gdn.integrations.transformers.unpatch: {foreign} were replaced after gdn patched them; "
                "undo that first"
            )
        for replacement in reversed(replacements):
            replacement.revert()
        _active.active = False
        _active = None


def is_patched() -> bool:
    return _active is not None


def patch_record() -> dict[str, Any] | None:
    """The active patch as JSON-able data (None when not patched): transformers version, mode, per
    class the API style, what was replaced and the calls per op and route since patching, and per
    live module instance that ran through gdn its calls per op and route."""
    state = _active
    return None if state is None else state.record()
