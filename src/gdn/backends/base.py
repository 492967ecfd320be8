"""What a backend is: a named table of op implementations, the devices it serves, why it may be
unavailable, and the route string that says which code path actually runs.

A backend is one class: declared attributes (the dataclass fields below, whose defaults a subclass
redeclares) and overridable methods. A built-in one declares itself in its module (gdn.backends.registry)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

from gdn.errors import describe_error

if TYPE_CHECKING:
    from gdn.calls import Call

OpTable = Mapping[str, Callable]
# the behaviour a subclass gives as methods and a plain Backend(...) may take as functions of the same
# names and arguments (gdn.register_backend(Backend(name=..., ops=..., check=...)))
HOOKS = ("loader", "check", "route", "compile_ahead", "watch")


def import_version(module: str) -> str:
    """The version an imported peer package states ("unknown" where it states none): a peer's route."""
    return getattr(importlib.import_module(module), "__version__", "unknown")


@dataclass(eq=False)
class Backend:
    """A backend.

    `ops` is the op table, or `loader()` builds it on first use (so importing gdn never imports triton,
    fla or torch_npu); an exception from the loader makes the backend unavailable with that reason.
    `check(device_type)` returns why the backend cannot serve a device type (None when it can).
    `auto_rank` orders the candidates in `auto` mode per device type (lower first; a device type it
    lacks is never tried in auto). `route(op)` names the code path per op, e.g. "triton:bundled" or
    "ascendc:stable-api".
    `forward_only` names ops it serves without a backward (inference kernels). An implementation may
    carry `prepare(call) -> step`, its own prepared step for calls with `call`'s metadata
    (gdn.prepared uses it for the pool update where the kernel guards the values).

    `loader`, `check`, `route`, `compile_ahead` and `watch` are methods a subclass defines; a plain
    Backend takes them as functions of the same names (the instance's function stands in for the
    method), and has none of them otherwise (None: no table, no check, the backend's name as its
    route, nothing compiled ahead, nothing watched). `describe()` is what the backend says about itself
    in the probe's manifest, `timing(op)` what the cell's benchmark runs its timed calls under.
    """

    name: str
    ops: OpTable | None = None
    devices: tuple[str, ...] = ("cpu", "cuda", "npu")
    auto_rank: Mapping[str, int] = field(default_factory=dict)
    needs_probe: bool = True
    probe_tolerance: Mapping[str, float] = field(default_factory=dict)
    # ops served for inference only: probed without gradients; a call that needs gradients runs eager
    forward_only: frozenset[str] = frozenset()
    # ops whose kernels check the index and offset values on the device (a slot out of range or
    # repeated, offsets out of order): they never touch memory out of range and give those rows NaN, so
    # the host checks that read those values (a device-to-host sync per call) are skipped for them
    guards_values: frozenset[str] = frozenset()
    # ops whose implementation hands index or offset values to a kernel that does not check them and
    # would read or write out of range on a bad one (a peer's kernel, a grid planned from the offsets):
    # their host value checks run whatever GDN_VALUE_CHECKS says, and during CUDA-graph capture, where
    # they cannot, such a call is refused. An op in neither set reads the values on the host itself and
    # serves a bad row NaN without the checks.
    trusts_values: frozenset[str] = frozenset()
    # the numeric probe's input dtype (None: fp32) and (K, V) head dims (None: small defaults), for
    # kernels that take only half precision or only some head sizes
    probe_dtype: Any = None
    probe_head_dims: tuple[int, int] | None = None
    # (K, V) outside the limits the backend refuses: its probe also tries a case there, which must be
    # refused (on record) or else computed right
    probe_outside_limits: tuple[int, int] | None = None
    # an external library's adapter (a peer under test), which the cell's benchmark times after gdn's
    # own backends: its first calls may autotune or compile for minutes
    peer: bool = False
    # whether its first calls compile anything (the benchmark warms up those that do)
    compiles: bool = True
    # () -> OpTable: builds the op table on first use; an exception makes the backend unavailable
    loader: InitVar[Callable[[], OpTable] | None] = None
    # (device type) -> why the backend cannot serve it, or None
    check: InitVar[Callable[[str], str | None] | None] = None
    # (op) -> the route string of the code path that serves op
    route: InitVar[Callable[[str], str] | None] = None
    # (op, validated calls, meanwhile) -> None: compiles, together, the binaries those calls will launch
    # (the numeric probe hands over all its cases before running them), running `meanwhile` (the
    # probe's eager references) while they compile
    compile_ahead: InitVar[Callable[[str, list[Call], Callable[[], object]], None] | None] = None
    # a peer that dispatches again inside itself (fla's registry, FlashQLA's per-architecture kernels):
    # () -> a context manager under which that dispatch notes what it ran in gdn's kernel log
    # (gdn.kernel_log), yielding whether the peer was found to watch
    watch: InitVar[Callable[[], AbstractContextManager[bool]] | None] = None
    _load_error: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self, *functions: Callable | None) -> None:
        for name, function in zip(HOOKS, functions, strict=True):
            own = getattr(type(self), name, None)
            # a subclass's own method comes back here as a bound method through dataclasses.replace
            if function is not None and (own is None or getattr(function, "__func__", None) is not own):
                setattr(self, name, function)

    def _table(self) -> OpTable | None:
        if self.ops is None and self.loader is not None and self._load_error is None:
            try:
                self.ops = self.loader()
            except Exception as exc:  # a broken wheel must surface as a reason, never as a crash
                self._load_error = describe_error(exc)
        return self.ops

    def why_unavailable(self, device_type: str) -> str | None:
        if device_type not in self.devices:
            return f"serves devices {list(self.devices)}, not {device_type}"
        if self.check is not None:
            reason = self.check(device_type)
            if reason:
                return reason
        if self._table() is None:
            return self._load_error or "no op table"
        return None

    def implementation(self, op: str) -> Callable | None:
        table = self._table()
        return None if table is None else table.get(op)

    def why_op_unavailable(self, op: str) -> str | None:
        """Why this backend has no implementation of op (None: it simply does not serve it)."""
        return None

    def refusal(self, op: str, call: Call) -> str | None:
        """Why this backend cannot take one validated call (gdn.calls.Call) of an op it serves: the
        resolver hands such a call to the next candidate. None: it takes the call."""
        return None

    def route_of(self, op: str) -> str:
        return self.route(op) if self.route is not None else self.name

    def describe(self) -> dict[str, Callable[[], Any]]:
        """The backend's sections of the probe's manifest (gdn.matrix.probe), each built when the
        probe asks for it: section name -> () -> JSON-able value (the versions of what it runs, the
        peer's own dispatch). An exception in one becomes {"error": ...} in that section alone."""
        return {}

    @contextlib.contextmanager
    def timing(self, op: str) -> Iterator[str | None]:
        """What the cell's benchmark (gdn.matrix.bench) times `op`'s calls under, yielding the note its
        rows carry (None: nothing to say)."""
        yield None
