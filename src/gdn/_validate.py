"""Input checks shared by every op: each problem raises ValueError/TypeError naming the argument,
what was expected and what came, before any backend sees the call."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from gdn import env_vars

COMPUTE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
ACTIVATIONS = (None, "silu", "swish")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _type_name(value: object) -> str:
    """`list`, `NoneType`; qualified outside builtins (`numpy.bool`, `torch.Tensor`) so that a numpy bool
    is not reported as a plain `bool`."""
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _fp64_note(dtype: torch.dtype) -> str:
    return " (fp64 is not supported by the GDN kernels)" if dtype == torch.float64 else ""


def _has_values(t: torch.Tensor) -> bool:
    """Meta tensors carry shapes but no data, so checks that read values cannot run on them."""
    return t.device.type != "meta"


VALUE_CHECK_MODES = ("auto", "1", "0")
# a value check and its arguments (cheaper to build per call than a bound partial)
PendingCheck = tuple[Callable[..., None], tuple]
# the value checks of the op being prepared, held until the backend that serves the call is known
_pending: ContextVar[list[PendingCheck] | None] = ContextVar("gdn_pending_value_checks", default=None)


def value_check_mode() -> str:
    """GDN_VALUE_CHECKS: "auto" (default), "1" (always) or "0" (never); anything else is an error."""
    mode = env_vars.read("GDN_VALUE_CHECKS", "auto")
    if mode not in VALUE_CHECK_MODES:
        raise ValueError(f"GDN_VALUE_CHECKS: expected one of {list(VALUE_CHECK_MODES)}, got {mode!r}")
    return mode


class deferred_value_checks:  # noqa: N801 (used as a function: `with deferred_value_checks() as pending`)
    """Collect the checks that read tensor values (cu_seqlens order, pool indices) instead of running
    them: each needs a device-to-host copy, which stalls the host until the device catches up. The
    caller runs them with run_value_checks once it knows whether the serving kernel guards the values.
    (A class, not a generator: every op call enters it, and a generator's context costs more.)"""

    __slots__ = ("pending", "token")

    def __enter__(self) -> list[PendingCheck]:
        self.pending: list[PendingCheck] = []
        self.token = _pending.set(self.pending)
        return self.pending

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        _pending.reset(self.token)
        if kind is not None and issubclass(kind, (ValueError, TypeError)):
            # the call fails anyway: a bad value of an earlier argument (offsets that miscount the
            # sequences) is the cause to name, as the checks run in argument order
            run_value_checks(self.pending, kernel_guards=False)


def run_value_checks(
    pending: list[PendingCheck], *, kernel_guards: bool, kernel_trusts: bool = False, serving: str = ""
) -> None:
    """Run the collected value checks where they are needed: by default ("auto") only when the serving
    kernel does not guard the values itself (a kernel that does never touches memory out of range and
    gives the rows NaN instead); GDN_VALUE_CHECKS=1 always (clear errors while debugging), =0 only
    where the kernel trusts the values (`kernel_trusts`: it would read or write out of range on a bad
    one), elsewhere never (an implementation that reads the values on the host serves a bad row NaN).
    Never while a CUDA graph is being captured, where a host copy is illegal: a kernel that trusts the
    values is then refused (`serving` names the op and backend in the error)."""
    mode = value_check_mode()
    if not pending:  # most calls: nothing to run, and asking whether a graph is captured costs a µs
        return
    if _capturing():
        if kernel_trusts:
            raise RuntimeError(
                f"{serving}: its kernel does not check slot indices or offsets, and the host checks that "
                "stand in for it cannot run while a CUDA graph is captured; capture this call on a backend "
                "whose kernel checks them (triton), or run it outside the graph"
            )
        return
    if not kernel_trusts and (mode == "0" or (mode == "auto" and kernel_guards)):
        return
    for check, args in pending:
        check(*args)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _value_check(check: Callable[..., None], *args: Any) -> None:
    """Run check(*args) now, or hold it for the op being prepared (deferred_value_checks)."""
    for recorded in _recording.get():
        recorded.append((check, args))
    pending = _pending.get()
    if pending is None:
        if value_check_mode() != "0" and not _capturing():
            check(*args)
    else:
        pending.append((check, args))


# The value checks registered while remember_accepted validates, one list per validation under way (a
# check that calls another records what the inner one registers too).
_recording: ContextVar[tuple[list[PendingCheck], ...]] = ContextVar("gdn_recording", default=())
# sets: every call tests each argument's type against them
PLAIN_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))
SCALARS = frozenset((type(None), bool, int, float, str))
ACCEPTED_LIMIT = 4096
Checked = TypeVar("Checked", bound=Callable[..., Any])


def remember_accepted(check: Checked) -> Checked:
    """Validate each distinct signature once. The metadata checks read only the arguments' types,
    shapes, dtypes, devices and scalar values; a call whose arguments match those of a call already
    accepted gets that call's result without running them again (a decode step repeats one signature
    every token, and the checks cost more host time than the kernel's launch). The value checks still
    run per call, on this call's tensors: the accepted call's are recorded and re-registered. `check`
    takes the op's name and its bound arguments (gdn.op_specs.OpSpec.bind: one order per op)."""
    accepted: dict[tuple, tuple[Any, list[PendingCheck]]] = {}

    @functools.wraps(check)
    def checked(op: str, arguments: Mapping[str, Any]) -> Any:
        values = tuple(arguments.values())
        # what the metadata checks read of each argument, hashable; None for one they may read more of
        # (a tensor subclass, a FakeTensor's symbolic shape, a container), which is then checked in
        # full. One comprehension: a decode step computes this every token.
        key = tuple(
            [
                (a.shape, a.dtype, a.device)
                if type(a) in PLAIN_TENSORS
                else (type(a), a)
                if type(a) in SCALARS
                else None
                for a in values
            ]
        )
        if None in key:
            return check(op, arguments)
        key = (op, key)
        hit = accepted.get(key)
        if hit is not None:
            result, recipes = hit
            for value_check, where in recipes:
                _value_check(value_check, *(values[i] if i is not None else const for i, const in where))
            return result
        recorded: list[PendingCheck] = []
        token = _recording.set((*_recording.get(), recorded))
        try:
            result = check(op, arguments)
        finally:
            _recording.reset(token)
        recipes = [(fn, _positions(fn_args, values)) for fn, fn_args in recorded]
        if all(where is not None for _, where in recipes):
            if len(accepted) >= ACCEPTED_LIMIT:
                accepted.clear()
            accepted[key] = (result, recipes)
        return result

    checked.cache_clear = accepted.clear  # type: ignore[attr-defined]  (as functools' caches name it)
    return checked  # type: ignore[return-value]


def _positions(fn_args: tuple, args: tuple) -> tuple[tuple[int | None, Any], ...] | None:
    """A recorded value check's arguments as (position in args, None) for a tensor the call passed in,
    (None, value) for a constant; None when a tensor is not one of the call's (it cannot be replayed)."""
    where = []
    for value in fn_args:
        if isinstance(value, torch.Tensor):
            found = next((i for i, arg in enumerate(args) if arg is value), None)
            if found is None:
                return None
            where.append((found, None))
        else:
            where.append((None, value))
    return tuple(where)


class Checker:
    """Builds messages of the form `<op>: argument '<name>' expected <what>, got <actual>`."""

    def __init__(self, op: str):
        self.op = op

    def fail(self, name: str, expected: str, got: object, exc: type[Exception] = ValueError) -> None:
        raise exc(f"{self.op}: argument '{name}' expected {expected}, got {got}")

    def tensor(self, name: str, t: object, *, optional: bool = False) -> torch.Tensor | None:
        if t is None and optional:
            return None
        if not isinstance(t, torch.Tensor):
            self.fail(name, "a torch.Tensor", _type_name(t), TypeError)
        return t

    def ndim(self, name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
        if t.ndim != ndim:
            self.fail(name, f"a {ndim}-D tensor {layout}", f"{t.ndim}-D shape {_shape(t)}")

    def shape(self, name: str, t: torch.Tensor, expected: list[int], layout: str) -> None:
        if _shape(t) != expected:
            self.fail(name, f"shape {layout} = {expected}", _shape(t))

    def float_dtype(self, name: str, t: torch.Tensor, allowed=COMPUTE_DTYPES) -> None:
        if t.dtype not in allowed:
            names = ", ".join(_dtype_name(d) for d in allowed)
            self.fail(name, f"dtype in ({names}){_fp64_note(t.dtype)}", _dtype_name(t.dtype), TypeError)

    def same_dtype(self, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
        if t.dtype != ref.dtype:
            expected = f"dtype {_dtype_name(ref.dtype)} (same as '{ref_name}'){_fp64_note(t.dtype)}"
            self.fail(name, expected, _dtype_name(t.dtype), TypeError)

    def index_dtype(self, name: str, t: torch.Tensor) -> None:
        if t.dtype not in INDEX_DTYPES:
            self.fail(name, "an integer tensor (int32 or int64)", f"dtype {_dtype_name(t.dtype)}", TypeError)

    def same_device(self, tensors: dict[str, torch.Tensor | None]) -> torch.device:
        present = [(n, t) for n, t in tensors.items() if t is not None]
        ref_name, ref = present[0]
        for name, t in present[1:]:
            if t.device != ref.device:
                self.fail(name, f"device {ref.device} (same as '{ref_name}')", f"device {t.device}")
        return ref.device

    def flag(self, name: str, value: object) -> bool:
        if not isinstance(value, bool):
            self.fail(name, "a bool", _type_name(value), TypeError)
        return value

    def unsupported(self, name: str, value: object, default: object, feature: str) -> None:
        """An argument of the library gdn stands in for, asking for a feature gdn does not implement:
        its default passes, anything else is refused by name rather than ignored."""
        if value is not default:
            got = repr(value) if isinstance(value, (bool, int, float, str)) else _type_name(value)
            self.fail(name, f"{default!r} (gdn does not implement {feature})", got, TypeError)

    def positive(self, name: str, size: int, what: str) -> None:
        if size < 1:
            self.fail(name, f"{what} >= 1", size)

    def positive_real(self, name: str, value: object, expected: str) -> float:
        """A real, finite, positive number, returned as a Python float: any `numbers.Real` (int, float,
        a numpy scalar, a Fraction), bool excluded. A tensor is refused, 0-d too: its value would be
        read on the host (a device-to-host sync) or be unknown while torch.compile traces."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            self.fail(name, expected, _type_name(value), TypeError)
        try:
            as_float = float(value)
        except OverflowError:
            self.fail(name, f"{expected} (finite and > 0)", "an int too large for a float")
        if not math.isfinite(as_float) or as_float <= 0:
            self.fail(name, f"{expected} (finite and > 0)", value)
        return as_float

    def scale(self, scale: object, head_dim: int) -> float:
        return head_dim**-0.5 if scale is None else self.given_scale(scale)

    def given_scale(self, scale: object) -> float:
        return self.positive_real("scale", scale, "None or a positive real number")

    def activation(self, activation: object) -> None:
        # Compare strings only: `in` on the tuple would call __eq__ of arbitrary objects (an array's is
        # elementwise and its truth value raises).
        if not (activation is None or (isinstance(activation, str) and activation in ACTIVATIONS)):
            self.fail("activation", f"one of {list(ACTIVATIONS)}", repr(activation))

    def head_first(self, head_first: object) -> None:
        if head_first is not False:
            self.fail(
                "head_first",
                "False (the legacy head-first [B, H, T, K] layout was removed; pass [B, T, H, K])",
                repr(head_first),
            )

    def offsets(self, name: str, offsets: torch.Tensor, total: int, count_name: str = "T") -> None:
        """cu_seqlens / query_start_loc: 1-D integer, >= 2 entries, 0 first, `total` last, never decreasing."""
        self.index_dtype(name, offsets)
        if offsets.ndim != 1 or offsets.numel() < 2:
            self.fail(name, "a 1-D tensor [N + 1] with N >= 1 sequences", f"shape {_shape(offsets)}")
        if _has_values(offsets):
            _value_check(self._offset_values, name, offsets, total, count_name)

    def _offset_values(self, name: str, offsets: torch.Tensor, total: int, count_name: str) -> None:
        fault = first_offset_fault(name, offsets.tolist(), total, count_name)
        if fault is not None:
            self.fail(name, *fault)

    def slot_indices(self, name: str, indices: torch.Tensor, rows: int, pool_name: str, pool_slots: int) -> None:
        """Pool slot indices: 1-D integer [rows]; -1 skips a row; live entries in range and unique."""
        self.index_dtype(name, indices)
        if indices.ndim != 1 or indices.numel() != rows:
            self.fail(name, f"a 1-D tensor [{rows}] (one slot per sequence)", f"shape {_shape(indices)}")
        if _has_values(indices):
            _value_check(self._slot_values, name, indices, pool_name, pool_slots)

    def _slot_values(self, name: str, indices: torch.Tensor, pool_name: str, pool_slots: int) -> None:
        faults = slot_faults(indices.tolist(), pool_slots)
        if not faults:
            return
        fault = faults[0]
        if fault.earlier is None:
            self.fail(
                name, f"slots in [0, {pool_slots}) of '{pool_name}' or -1 (skip)", f"{name}[{fault.row}] = {fault.slot}"
            )
        self.fail(
            name,
            "distinct live slots (two rows would write one pool slot)",
            f"{name}[{fault.earlier}] = {name}[{fault.row}] = {fault.slot}",
        )


def first_offset_fault(name: str, values: list[int], total: int, count_name: str = "T") -> tuple[str, str] | None:
    """What is wrong with offsets `values` (cu_seqlens, query_start_loc) of `total` tokens, as (expected,
    got), or None: they start at 0, end at `total` and never decrease."""
    if values[0] != 0:
        return "first entry 0", str(values[0])
    if values[-1] != total:
        return f"last entry {total} (= {count_name}, the number of tokens)", str(values[-1])
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            return "non-decreasing offsets", f"{name}[{i}] = {values[i]} < {name}[{i - 1}] = {values[i - 1]}"
    return None


@dataclass(frozen=True)
class SlotFault:
    """A pool slot index that a pooled op cannot serve: out of [-1, slots), or a live slot that an
    earlier row names too (`earlier`: that row; two rows would write one slot, so neither is served)."""

    row: int
    slot: int
    earlier: int | None = None


def slot_faults(slots: list[int], pool_slots: int) -> list[SlotFault]:
    """The faults of one call's slot indices (-1 skips a row), in row order."""
    faults: list[SlotFault] = []
    seen: dict[int, int] = {}
    for row, slot in enumerate(slots):
        if slot == -1:
            continue
        if not 0 <= slot < pool_slots:
            faults.append(SlotFault(row, slot))
        elif slot in seen:
            faults.append(SlotFault(row, slot, seen[slot]))
        else:
            seen[slot] = row
    return faults


@dataclass(frozen=True)
class GdnShapes:
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int  # number of sequences: B, or len(cu_seqlens) - 1


@remember_accepted
def check_gdn_inputs(op: str, arguments: Mapping[str, Any]) -> tuple[GdnShapes, float]:
    """The shared contract of the chunk and recurrent GDN ops (FLA layout), and the token part of the
    pool decode's (which has no initial_state, head_first or output_final_state). The initial state is
    [N, HV, K, V], or [N, HV, V, K] with state_v_first."""
    q, k, v, g, beta = (arguments[n] for n in ("q", "k", "v", "g", "beta"))
    scale, cu_seqlens, state_v_first = arguments["scale"], arguments["cu_seqlens"], arguments["state_v_first"]
    initial_state = arguments.get("initial_state")
    use_qk_l2norm_in_kernel = arguments["use_qk_l2norm_in_kernel"]
    c = Checker(op)
    head_first = arguments.get("head_first", False)
    c.head_first(head_first)
    c.flag("state_v_first", state_v_first)
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        c.tensor(name, t)
    c.tensor("initial_state", initial_state, optional=True)
    c.tensor("cu_seqlens", cu_seqlens, optional=True)
    c.flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)

    c.ndim("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    c.positive("q", B, "batch size B")
    c.positive("q", T, "sequence length T")
    c.positive("q", H, "head count H")
    c.positive("q", K, "head dim K")
    c.shape("k", k, [B, T, H, K], "[B, T, H, K] (same as q)")
    c.ndim("v", v, 4, "[B, T, HV, V]")
    if list(v.shape[:2]) != [B, T]:
        c.fail("v", f"shape [B, T, HV, V] with B, T = {B}, {T} (from q)", _shape(v))
    HV, V = v.shape[2], v.shape[3]
    c.positive("v", V, "head dim V")
    if HV < 1 or HV % H != 0:
        c.fail("v", f"a value head count HV that is a positive multiple of H = {H} (grouped value heads)", f"HV = {HV}")
    c.shape("g", g, [B, T, HV], "[B, T, HV]")
    c.shape("beta", beta, [B, T, HV], "[B, T, HV]")

    c.float_dtype("q", q)
    c.same_dtype("k", k, "q", q)
    c.same_dtype("v", v, "q", q)
    c.float_dtype("g", g)
    c.float_dtype("beta", beta)
    c.same_device(
        {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": initial_state, "cu_seqlens": cu_seqlens}
    )

    N = B
    if cu_seqlens is not None:
        if B != 1:
            c.fail("q", "batch size B = 1 when cu_seqlens is given (sequences are packed along T)", f"B = {B}")
        c.offsets("cu_seqlens", cu_seqlens, T)
        N = cu_seqlens.numel() - 1
    if initial_state is not None:
        c.float_dtype("initial_state", initial_state)
        layout = "[N, HV, V, K] (state_v_first" if state_v_first else "[N, HV, K, V] ("
        c.shape(
            "initial_state",
            initial_state,
            [N, HV, V, K] if state_v_first else [N, HV, K, V],
            f"{layout}; N = B, or the number of sequences in cu_seqlens)",
        )
    shapes, scale = GdnShapes(B, T, H, HV, K, V, N), c.scale(scale, K)
    if "output_final_state" in arguments:  # the pool decode has none
        c.flag("output_final_state", arguments["output_final_state"])
    return shapes, scale


@remember_accepted
def check_pool_decode_inputs(op: str, arguments: Mapping[str, Any]) -> tuple[GdnShapes, float]:
    """The pool decode contract: ssm_pool [max_slots, HV, K, V], or [max_slots, HV, V, K] with
    state_v_first."""
    q, ssm_pool, ssm_indices = arguments["q"], arguments["ssm_pool"], arguments["ssm_indices"]
    state_v_first = arguments["state_v_first"]
    c = Checker(op)
    c.tensor("ssm_pool", ssm_pool)
    c.tensor("ssm_indices", ssm_indices)
    shapes, scale = check_gdn_inputs(op, arguments)
    c.same_device({"q": q, "ssm_pool": ssm_pool, "ssm_indices": ssm_indices})
    layout = "[max_slots, HV, V, K] (state_v_first)" if state_v_first else "[max_slots, HV, K, V]"
    c.ndim("ssm_pool", ssm_pool, 4, layout)
    slots = ssm_pool.shape[0]
    c.positive("ssm_pool", slots, "max_slots")
    inner = [shapes.V, shapes.K] if state_v_first else [shapes.K, shapes.V]
    c.shape("ssm_pool", ssm_pool, [slots, shapes.HV, *inner], layout)
    c.float_dtype("ssm_pool", ssm_pool)
    c.slot_indices("ssm_indices", ssm_indices, shapes.N, "ssm_pool", slots)
    return shapes, scale


def check_conv_weight(c: Checker, x, weight, bias, dim: int) -> int:
    c.tensor("weight", weight)
    c.tensor("bias", bias, optional=True)
    c.ndim("weight", weight, 2, "[D, W] (depthwise kernel)")
    if weight.shape[0] != dim:
        c.fail("weight", f"shape [D, W] with D = {dim} (channels of x)", _shape(weight))
    width = weight.shape[1]
    c.positive("weight", width, "kernel width W")
    c.float_dtype("weight", weight)
    if bias is not None:
        c.shape("bias", bias, [dim], "[D]")
        c.float_dtype("bias", bias)
    return width


@remember_accepted
def check_conv_fn_inputs(op: str, arguments: Mapping[str, Any]) -> None:
    x, weight, bias, activation = (arguments[n] for n in ("x", "weight", "bias", "activation"))
    seq_idx, initial_states = arguments["seq_idx"], arguments["initial_states"]
    return_final_states, query_start_loc = arguments["return_final_states"], arguments["query_start_loc"]
    conv_states, cache_indices = arguments["conv_states"], arguments["cache_indices"]
    has_initial_state = arguments["has_initial_state"]
    c = Checker(op)
    c.tensor("x", x)
    c.activation(activation)
    c.flag("return_final_states", return_final_states)
    for name, t in (
        ("seq_idx", seq_idx),
        ("initial_states", initial_states),
        ("query_start_loc", query_start_loc),
        ("conv_states", conv_states),
        ("cache_indices", cache_indices),
        ("has_initial_state", has_initial_state),
    ):
        c.tensor(name, t, optional=True)
    c.float_dtype("x", x)
    if query_start_loc is None:
        for name, t in (
            ("conv_states", conv_states),
            ("cache_indices", cache_indices),
            ("has_initial_state", has_initial_state),
        ):
            if t is not None:
                c.fail(name, "None unless query_start_loc is given (varlen mode)", "a tensor")
        c.ndim("x", x, 3, "[B, D, T] (channel-first)")
        B, D, T = x.shape
        for what, size in (("batch size B", B), ("channels D", D), ("length T", T)):
            c.positive("x", size, what)
        width = check_conv_weight(c, x, weight, bias, D)
        if seq_idx is not None:
            c.index_dtype("seq_idx", seq_idx)
            c.shape("seq_idx", seq_idx, [B, T], "[B, T]")
        if initial_states is not None:
            c.shape("initial_states", initial_states, [B, D, width - 1], "[B, D, W - 1]")
            c.float_dtype("initial_states", initial_states)
        c.same_device({"x": x, "weight": weight, "bias": bias, "seq_idx": seq_idx, "initial_states": initial_states})
        return
    for name, t in (("seq_idx", seq_idx), ("initial_states", initial_states)):
        if t is not None:
            c.fail(name, "None in varlen mode (use conv_states / has_initial_state)", "a tensor")
    if return_final_states:
        c.fail("return_final_states", "False in varlen mode (final states are written to conv_states)", True)
    c.ndim("x", x, 2, "[D, total_T] (channel-first, sequences packed along T)")
    D, T = x.shape
    c.positive("x", D, "channels D")
    c.positive("x", T, "total length T")
    width = check_conv_weight(c, x, weight, bias, D)
    c.same_device(
        {
            "x": x,
            "weight": weight,
            "bias": bias,
            "query_start_loc": query_start_loc,
            "conv_states": conv_states,
            "cache_indices": cache_indices,
            "has_initial_state": has_initial_state,
        }
    )
    c.offsets("query_start_loc", query_start_loc, T)  # after the device check: it reads the values
    N = query_start_loc.numel() - 1
    if has_initial_state is not None:
        if has_initial_state.dtype != torch.bool:
            c.fail("has_initial_state", "a bool tensor", f"dtype {_dtype_name(has_initial_state.dtype)}", TypeError)
        c.shape("has_initial_state", has_initial_state, [N], "[N] (one flag per sequence)")
        if conv_states is None:
            c.fail("conv_states", "a conv-state pool [slots, D, W - 1] when has_initial_state is given", None)
    if cache_indices is not None and conv_states is None:
        c.fail("conv_states", "a conv-state pool [slots, D, W - 1] when cache_indices is given", None)
    if conv_states is not None:
        c.ndim("conv_states", conv_states, 3, "[slots, D, W - 1]")
        slots = conv_states.shape[0]
        c.positive("conv_states", slots, "slots")
        c.shape("conv_states", conv_states, [slots, D, width - 1], "[slots, D, W - 1]")
        c.float_dtype("conv_states", conv_states)
        if cache_indices is None:
            if slots < N:
                c.fail("conv_states", f"at least N = {N} slots when cache_indices is None", slots)
        else:
            c.slot_indices("cache_indices", cache_indices, N, "conv_states", slots)


@remember_accepted
def check_conv_update_inputs(op: str, arguments: Mapping[str, Any]) -> None:
    x, conv_state, weight, bias = (arguments[n] for n in ("x", "conv_state", "weight", "bias"))
    activation, conv_state_indices = arguments["activation"], arguments["conv_state_indices"]
    c = Checker(op)
    c.tensor("x", x)
    c.tensor("conv_state", conv_state)
    c.tensor("conv_state_indices", conv_state_indices, optional=True)
    c.activation(activation)
    if x.ndim not in (2, 3):
        c.fail("x", "a 2-D tensor [B, D] or 3-D tensor [B, D, L]", f"{x.ndim}-D shape {_shape(x)}")
    B, D = x.shape[:2]
    c.positive("x", B, "batch size B")
    c.positive("x", D, "channels D")
    if x.ndim == 3:
        c.positive("x", x.shape[2], "new tokens L")
    c.float_dtype("x", x)
    width = check_conv_weight(c, x, weight, bias, D)
    c.ndim("conv_state", conv_state, 3, "[slots, D, state_len]")
    slots, state_dim, state_len = conv_state.shape
    if state_dim != D or state_len < width - 1:
        c.fail(
            "conv_state",
            f"shape [slots, D, state_len] with D = {D} and state_len >= W - 1 = {width - 1}",
            _shape(conv_state),
        )
    c.float_dtype("conv_state", conv_state)
    c.same_device(
        {"x": x, "conv_state": conv_state, "weight": weight, "bias": bias, "conv_state_indices": conv_state_indices}
    )
    if conv_state_indices is None:
        if slots != B:
            c.fail("conv_state", f"{B} rows (batch size B) when conv_state_indices is None", f"{slots} rows")
    else:
        c.slot_indices("conv_state_indices", conv_state_indices, B, "conv_state", slots)


@remember_accepted
def check_l2norm_inputs(op: str, arguments: Mapping[str, Any]) -> None:
    x, eps = arguments["x"], arguments["eps"]
    c = Checker(op)
    c.tensor("x", x)
    c.float_dtype("x", x)
    if x.ndim < 1 or x.shape[-1] < 1:
        c.fail("x", "a tensor with a last dimension of size >= 1", f"shape {_shape(x)}")
    c.positive_real("eps", eps, "a positive real number")


@remember_accepted
def check_gating_inputs(op: str, arguments: Mapping[str, Any]) -> None:
    A_log, a, b, dt_bias = (arguments[n] for n in ("A_log", "a", "b", "dt_bias"))
    c = Checker(op)
    for name, t in (("A_log", A_log), ("a", a), ("b", b), ("dt_bias", dt_bias)):
        c.tensor(name, t)
        c.float_dtype(name, t)
    c.ndim("A_log", A_log, 1, "[HV]")
    HV = A_log.shape[0]
    c.positive("A_log", HV, "head count HV")
    c.shape("dt_bias", dt_bias, [HV], "[HV]")
    if a.ndim < 1 or a.shape[-1] != HV:
        c.fail("a", f"shape [..., HV] with HV = {HV}", _shape(a))
    c.shape("b", b, _shape(a), "[..., HV] (same as a)")
    c.same_device({"A_log": A_log, "a": a, "b": b, "dt_bias": dt_bias})
