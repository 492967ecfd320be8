"""Which route serves each op, decided once per process and recorded with the reason every other
route was not taken.

Preference: the stable API (fla_npu 26.10 `fla_npu.ops.ascendc`), then the legacy torch.ops.npu
ops (26.6, or 26.10 with the legacy extension). For chunk_gated_delta_rule on the stable API, the
composite forward `npu_chunk_gated_delta_rule_fwd` is used when the wheel ships it, paired with the
decomposed backward (route "ascendc:composite-fwd"); GDN_NPU_FUSED_FWD=0 turns it off, =1 asks for it.
The conv must also pass its numeric probe (conv_probe.py), route by route.

Decisions that GDN_STRICT=1 forbids are recorded per op (`strict_error`) rather than raised here, so
that the probe can report them: a route rejected by its numeric probe, and GDN_NPU_FUSED_FWD=1 without
the composite op. backend.py raises them when the backend is asked to serve that op.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gdn.backends.ascendc import contracts, knobs, surface
from gdn.backends.ascendc import device as npu_device
from gdn.backends.ascendc.chunk import ChunkKernels, make_chunk_gated_delta_rule, refusal_of
from gdn.backends.ascendc.conv import ConvKernels, make_causal_conv1d_fn
from gdn.backends.ascendc.conv_probe import probe_conv
from gdn.backends.ascendc.raw import (
    CHUNK_OPS,
    COMPOSITE,
    COMPOSITE_FWD,
    CONV_BWD,
    CONV_FN,
    CONV_RAW,
    LEGACY,
    RECURRENT,
    STABLE,
    RawOps,
    route_name,
)
from gdn.backends.ascendc.recurrent import make_recurrent_ops
from gdn.calls import Call, ConvCall

log = logging.getLogger("gdn")

CHUNK_OP = "chunk_gated_delta_rule"
CONV_OP = "causal_conv1d_fn"
RECURRENT_OPS = ("fused_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule_update")
SERVED = (CHUNK_OP, CONV_OP, *RECURRENT_OPS)


@dataclass
class Rejection:
    route: str
    reason: str
    probe: dict[str, Any] | None = None


@dataclass
class OpRoute:
    op: str
    route: str | None = None
    detail: str | None = None
    rejected: list[Rejection] = field(default_factory=list)
    strict_error: str | None = None  # what GDN_STRICT=1 refuses about this op's decision
    fn: Callable | None = None
    # why the route cannot take one validated call (None: it takes every call the op's contract admits)
    refusal: Callable[[Call], str | None] | None = None

    def record(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "detail": self.detail,
            "rejected": [vars(r) for r in self.rejected],
            "strict_error": self.strict_error,
        }

    @property
    def reason(self) -> str | None:
        """Why no route serves the op (None when one does)."""
        if self.route is not None:
            return None
        return "no fla_npu route: " + "; ".join(f"{r.route}: {r.reason}" for r in self.rejected)


@dataclass
class Plan:
    surface: surface.Surface
    npu: npu_device.Npu
    fused_fwd: str  # how GDN_NPU_FUSED_FWD was read
    ops: dict[str, OpRoute] = field(default_factory=dict)

    @property
    def unavailable(self) -> str | None:
        if self.surface.import_error:
            return f"fla_npu is not importable: {self.surface.import_error}"
        return None

    def record(self) -> dict[str, Any]:
        return {
            "npu": self.npu.record(),
            "surface": self.surface.record(),
            "fused_fwd": self.fused_fwd,
            "routes": {op: entry.record() for op, entry in self.ops.items()},
        }


def _needs(op: str, ops: RawOps) -> tuple[str, ...]:
    if op == CHUNK_OP:
        return CHUNK_OPS
    if op == CONV_OP:
        forward = CONV_FN if ops.route == STABLE and ops.has(CONV_FN) else CONV_RAW
        return (forward, CONV_BWD)
    return (RECURRENT,)


def _limited(op: str, call: Call) -> dict[str, int]:
    """The dimensions of one validated call of the conv or a recurrent op that the fla_npu contracts
    limit. The conv's state length is not among them: the adapter hands the kernels W - 1 columns."""
    if isinstance(call, ConvCall):
        D, W = call.weight.shape
        return {"D": D, "W": W}
    return {"DK": call.shapes.K, "DV": call.shapes.V}


def _limits_refusal(op: str, ops: RawOps) -> Callable[[Call], str | None]:
    """The refusal of a call outside the limits of any raw op the route calls for `op`."""
    needed = _needs(op, ops)
    return lambda call: contracts.refusal(ops.route, needed, _limited(op, call))


def _build(op: str, ops: RawOps, composite: RawOps | None) -> tuple[Callable, str | None, Callable]:
    """(the op's implementation, its entry point when not the usual one, its per-call refusal)."""
    if op == CHUNK_OP:
        kernels = ChunkKernels.bind(ops, composite)
        return make_chunk_gated_delta_rule(kernels), None, refusal_of(kernels)
    if op == CONV_OP:
        conv = ConvKernels.bind(ops)
        return make_causal_conv1d_fn(conv), conv.entry, _limits_refusal(op, ops)
    return make_recurrent_ops(ops.get(RECURRENT))[op], None, _limits_refusal(op, ops)


def _candidates(found: surface.Surface) -> list[tuple[str, RawOps | None, str | None]]:
    """(route, its ops or None, why it is unavailable) in preference order."""
    stable = None if found.stable is None else RawOps(STABLE, found.stable)
    legacy = None if found.legacy_ops is None else RawOps(LEGACY, found.legacy_ops)
    return [
        (STABLE, stable, found.stable_reason),
        (LEGACY, legacy, None if legacy else f"torch.ops.npu holds no fla_npu ops (legacy extension {found.legacy})"),
    ]


def _fused_fwd_text(requested: bool | None) -> str:
    return "unset (composite where shipped)" if requested is None else f"{knobs.FUSED_FWD_ENV}={int(requested)}"


def _composite(entry: OpRoute, ops: RawOps, requested: bool | None) -> RawOps | None:
    """Pick the composite forward for the chunk op, or record why not."""
    if requested is False:
        entry.rejected.append(Rejection(route_name(COMPOSITE), f"disabled by {knobs.FUSED_FWD_ENV}=0"))
        return None
    if ops.route == STABLE and ops.has(COMPOSITE_FWD):
        entry.route = route_name(COMPOSITE)
        entry.detail = f"{ops.where(COMPOSITE_FWD)} forward + decomposed backward on the {STABLE} ops"
        return ops
    why = (
        f"fla_npu.ops.ascendc has no {COMPOSITE_FWD}"
        if ops.route == STABLE
        else f"{COMPOSITE_FWD} needs the stable API, and the {ops.route} route serves"
    )
    entry.rejected.append(Rejection(route_name(COMPOSITE), why))
    if requested:
        entry.strict_error = f"{knobs.FUSED_FWD_ENV}=1 but {why}"
        log.warning(f"gdn.ascendc: {knobs.FUSED_FWD_ENV}=1 but {why}: the decomposed forward serves")
    else:
        log.info(f"gdn.ascendc: {why}: {CHUNK_OP} runs the decomposed forward")
    return None


def _resolve_op(op: str, plan: Plan, requested: bool | None, probe: Callable) -> OpRoute:
    entry = OpRoute(op)
    for route, ops, unavailable in _candidates(plan.surface):
        if ops is None:
            entry.rejected.append(Rejection(route_name(route), unavailable or "unavailable"))
            continue
        missing = ops.missing(_needs(op, ops))
        if missing:
            entry.rejected.append(Rejection(route_name(route), "lacks " + ", ".join(ops.where(m) for m in missing)))
            continue
        if entry.fn is not None:
            entry.rejected.append(Rejection(route_name(route), f"also available; {entry.route} is preferred"))
            continue
        composite = _composite(entry, ops, requested) if op == CHUNK_OP else None
        fn, detail, refusal = _build(op, ops, composite)
        if op == CONV_OP:
            record = probe(fn, plan.npu.device)
            if not record["passed"]:
                why = f"numeric conv probe failed: {record['reason']}"
                entry.rejected.append(Rejection(route_name(route), why, record))
                entry.strict_error = entry.strict_error or f"{route_name(route)} {why}"
                continue
        entry.fn, entry.route, entry.refusal = fn, entry.route or route_name(route), refusal
        entry.detail = entry.detail or detail
    _log_op(entry)
    return entry


def _log_op(entry: OpRoute) -> None:
    probed = [r for r in entry.rejected if r.probe is not None]
    if not probed and entry.route is not None:
        return  # the resolver logs the route it picks
    outcome = entry.route or "no route"
    why = "; ".join(f"{r.route}: {r.reason}" for r in (probed or entry.rejected))
    (log.warning if probed else log.info)(f"gdn.ascendc: {entry.op} -> {outcome} ({why})")


def resolve_plan(found: surface.Surface, npu: npu_device.Npu, probe: Callable = probe_conv) -> Plan:
    """The routes of every op for an fla_npu `found` as loaded, on `npu`'s device."""
    requested = knobs.fused_fwd()
    plan = Plan(found, npu, _fused_fwd_text(requested))
    log.info(f"gdn.ascendc: {found.summary}")
    if plan.unavailable is None:
        for op in SERVED:
            plan.ops[op] = _resolve_op(op, plan, requested, probe)
    return plan


_lock = threading.Lock()
_plan: Plan | None = None


def plan() -> Plan:
    """This process's plan: fla_npu is loaded and every route probed on the first call only."""
    global _plan
    with _lock:
        if _plan is None:
            npu = npu_device.locate()
            if npu.device is None:
                raise RuntimeError(npu.error)
            _plan = resolve_plan(surface.load(), npu)
        return _plan
