"""Each GDN op, declared once: its arguments (position, keyword-only, type, default, whether the small
tensors are read densely), what it returns and writes in place, what a peer library calls it, and the
custom ops (gdn.library) it becomes inside torch.compile. The public signatures (gdn.ops), the binding
of a call to its arguments (gdn.calls), the custom-op schemas and fakes (gdn.library), the step cache's
tensors (gdn.prepared) and the transformers integration's names all read these. The built-in ops'
specs are declared where their calls are (gdn.calls), each beside its call type, validation and
numeric probe cases; this module is the language they are written in and the table of every op.

Kept free of torch, so that configuration code can import it."""

from __future__ import annotations

import functools
import inspect
import keyword
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

REQUIRED = inspect.Parameter.empty
# an argument's type as the custom-op schema writes it, and as the public signature annotates it
_ANNOTATIONS = {"Tensor": "torch.Tensor", "float": "float", "bool": "bool", "str": "str", "object": "object"}


@dataclass(frozen=True)
class Arg:
    """One argument. `kind` is its schema type without optionality (`Tensor`, `float`, `bool`, `str`;
    `object` for a peer's argument that no custom op carries); a default of None makes it optional.
    `carried` is False where the custom op has no place for it: a peer's feature gdn refuses unless it
    holds its default (`refused` says which feature gdn lacks), or a legacy flag that must hold it.
    `dense`: a small tensor (offsets, slot indices, flags, bias, conv weight, gate parameters) the
    kernels read as a dense buffer without strides, made contiguous once for every backend; the large
    operands and the state pools keep their strides (a pool is written in place)."""

    name: str
    kind: str = "Tensor"
    default: Any = REQUIRED
    keyword_only: bool = False
    carried: bool = True
    dense: bool = False
    refused: str | None = None

    @property
    def optional(self) -> bool:
        return self.default is None

    def annotation(self) -> str:
        base = _ANNOTATIONS[self.kind]
        return f"{base} | None" if self.optional and self.kind != "object" else base

    def parameter(self) -> inspect.Parameter:
        kind = inspect.Parameter.KEYWORD_ONLY if self.keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Parameter(self.name, kind, default=self.default, annotation=self.annotation())


@dataclass(frozen=True)
class Output:
    """One returned tensor: the input it takes its shape (and, without `dtype`, its dtype) from; None
    where its shape follows from the validated call (a final state: gdn.library computes it). `asked_by`
    names the flag that asks for it; not asked for, it is None in the public result (`dropped`: left out
    of it)."""

    name: str
    like: str | None
    dtype: str | None = None
    asked_by: str | None = None
    dropped: bool = False


@dataclass(frozen=True)
class CustomOp:
    """A custom op an op becomes in a compiled region: its name, the arguments it carries (in order),
    those it requires although the op does not, its outputs and the arguments that get gradients (none:
    inference only). `selected_by` names an argument whose being given picks this custom op over the
    op's first one."""

    name: str
    args: tuple[str, ...]
    outputs: tuple[Output, ...]
    grads: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    selected_by: str | None = None


@dataclass(frozen=True)
class OpSpec:
    """One op. `peer_positional`: the library gdn is a drop-in for and what it binds at the first
    position gdn does not share with it (an extra positional argument is refused by that name).
    `step_tensors`: how many leading positional arguments are the tensors of its prepared step (0:
    none). `transformers`: the names transformers' GDN layers look it up by (an instance attribute up
    to 5.14, a module-level function from 5.15). `mutates`: the arguments written in place."""

    name: str
    args: tuple[Arg, ...]
    outputs: tuple[Output, ...]
    grads: tuple[str, ...] = ()
    mutates: tuple[str, ...] = ()
    forms: tuple[CustomOp, ...] = ()
    peer_positional: tuple[str, str] | None = None
    step_tensors: int = 0
    transformers: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        # the names become a function's (OpSpec._binder); the signature checks their order and defaults
        for name in (self.name, *(a.name for a in self.args)):
            if not name.isidentifier() or keyword.iskeyword(name):
                raise ValueError(f"OpSpec: expected op and argument names that are identifiers, got {name!r}")
        self.signature()
        # made now what every call reads: a compiled region cannot trace a cached property's first read
        # (its lock), and binds its calls too (gdn.library)
        self._binder, self._feature_defaults, self.kept  # noqa: B018

    def arg(self, name: str) -> Arg:
        return next(a for a in self.args if a.name == name)

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    @functools.cached_property
    def positional(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if not a.keyword_only)

    @functools.cached_property
    def dense(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.dense)

    @functools.cached_property
    def refused(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.refused is not None)

    def signature(self) -> inspect.Signature:
        return inspect.Signature([a.parameter() for a in self.args])

    @functools.cached_property
    def custom_ops(self) -> tuple[CustomOp, ...]:
        """The custom ops it becomes: its forms, or one of its name carrying every carried argument."""
        if self.forms:
            return self.forms
        carried = tuple(a.name for a in self.args if a.carried)
        return (CustomOp(self.name, carried, self.outputs, self.grads),)

    def schema_type(self, name: str, form: CustomOp) -> str:
        arg = self.arg(name)
        written = "(a!)" if name in self.mutates else ""
        optional = "?" if arg.optional and name not in form.required else ""
        return f"{arg.kind}{written}{optional}"

    @functools.cached_property
    def kept(self) -> int:
        """How many arguments a call binds (gdn.calls.Arguments) where it names no refused peer feature."""
        return len(self.args) - len(self.refused)

    def bind(self, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Every argument's value in a call `self.name(*args, **kwargs)`, in the spec's order, defaults
        filled in; a refused peer feature only where it is not at its default (after the rest), for the
        caller to refuse. Or the TypeError of a call its signature cannot bind: Python's own, word for
        word (an extra positional argument of a peer's call is refused by the name the peer gives it)."""
        if len(args) > len(self.positional) and self.peer_positional is not None:
            self._refuse_extra_positionals()
        values, features = self._binder(*args, **kwargs)
        if features and any(map(operator.is_not, features, self._feature_defaults)):
            for arg, value in zip(self.refused, features, strict=True):
                if value is not arg.default:
                    values[arg.name] = value
        return values

    @functools.cached_property
    def _binder(self) -> Callable[..., tuple[dict[str, Any], tuple]]:
        """A function with the op's signature that returns its arguments, the refused features' apart:
        Python binds every op call, in a fraction of the time binding by hand took, and raises its own
        TypeErrors. Its source holds nothing but the argument names, identifiers (__post_init__); the
        defaults are the function's own attributes."""
        by_keyword = [a.name for a in self.args if a.keyword_only]
        params = ", ".join([*self.positional, *(["*", *by_keyword] if by_keyword else [])])
        kept = ", ".join(f"{a.name!r}: {a.name}" for a in self.args if a.refused is None)
        features = "".join(f"{a.name}, " for a in self.refused)
        namespace: dict[str, Any] = {}
        exec(f"def {self.name}({params}):\n    return {{{kept}}}, ({features})", namespace)
        binder = namespace[self.name]
        binder.__defaults__ = tuple(a.default for a in self.args if not a.keyword_only and a.default is not REQUIRED)
        binder.__kwdefaults__ = {a.name: a.default for a in self.args if a.keyword_only and a.default is not REQUIRED}
        return binder

    @functools.cached_property
    def _feature_defaults(self) -> tuple:
        return tuple(a.default for a in self.refused)

    def _refuse_extra_positionals(self) -> None:
        peer, name = self.peer_positional
        positional = self.positional
        raise TypeError(
            f"{self.name}: argument {len(positional) + 1} ('{name}' in {peer}) must be passed by keyword: gdn "
            f"takes only {', '.join(positional)} by position"
        )


def refused_feature(name: str, kind: str, feature: str) -> Arg:
    """A peer's keyword for a feature gdn does not implement: its default passes, anything else is
    refused by name rather than ignored."""
    return Arg(name, kind, False if kind == "bool" else None, True, carried=False, refused=feature)


# every op by name: the built-in ones (declared with their calls, gdn.calls), then those register_op adds
# (gdn.op_registration)
BY_NAME: dict[str, OpSpec] = {}
_BUILT_IN: set[str] = set()


def register(spec: OpSpec, *, built_in: bool = False) -> None:
    """Add an op (a built-in one: never unregistered); its name is taken for the process."""
    if spec.name in BY_NAME:
        raise ValueError(f"register: argument 'spec' expected an op of a new name, got {spec.name!r}, already an op")
    BY_NAME[spec.name] = spec
    if built_in:
        _BUILT_IN.add(spec.name)


def unregister(name: str) -> OpSpec:
    """Remove an op register() added (a built-in op stays); returns its spec."""
    if name not in BY_NAME or name in _BUILT_IN:
        raise ValueError(f"unregister: argument 'name' expected an op register() added, got {name!r}")
    return BY_NAME.pop(name)
