"""Measuring: every backend that serves an op on the device, on every case of the op, against the fp64
reference, by ||out - ref|| / ||ref|| per quantity.

A backend's implementation is called directly with the validated call, not through the resolver: the
table says how far off each kernel is, including a kernel the resolver's numeric probe would reject (a
backend whose probe fails is still a kernel some user runs). A call the backend refuses is a `refused`
row with its reason; an exception, an `error` row. What each row's calls ran, down to a peer's own
dispatch, is read from gdn's kernel log (the caller turns it on: gdn.matrix.kernels.recording).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from gdn import kernel_log
from gdn.backends.base import Backend, describe_error
from gdn.calls import PREPARE
from gdn.matrix.accuracy import reference
from gdn.matrix.accuracy.cases import (
    CONV_OPS,
    DTYPES,
    GATED_OPS,
    LAYOUTS,
    OPS,
    QUANTITIES,
    REGIMES,
    Size,
    conv_case,
    decode_case,
    gated_case,
)
from gdn.matrix.kernels import kernel_counts
from gdn.matrix.schema import AccuracyRow

# a result per quantity, in QUANTITIES' order; None where the backend computes no such quantity
Results = dict[str, torch.Tensor | None]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float | None:
    """||out - ref|| / ||ref|| in fp64 (None where out is not finite)."""
    out = out.detach().double()
    if not torch.isfinite(out).all():
        return None
    ref = ref.detach().double().to(out.device)
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


@dataclass(frozen=True)
class Case:
    """One row key of the table: the op and what its inputs are."""

    op: str
    dtype: str
    regime: str | None
    layout: str | None

    def seed(self) -> int:
        """The same inputs for every backend of the case, other inputs for every case."""
        text = f"{self.op}/{self.dtype}/{self.regime}/{self.layout}"
        return sum(ord(c) * 31**i for i, c in enumerate(text)) % 2**31


def cases(ops: tuple[str, ...] = OPS, dtypes: list[str] | None = None) -> Iterator[Case]:
    for op in ops:
        for dtype in dtypes or DTYPES:
            if op in CONV_OPS:
                yield Case(op, dtype, None, None)
                continue
            for regime in REGIMES:
                layouts = (None,) if op == "fused_recurrent_gated_delta_rule_update" else LAYOUTS
                for layout in layouts:
                    yield Case(op, dtype, regime, layout)


# ---------------------------------------------------------------- each op: run a backend, run the reference


def _gated(case: Case, size: Size, device: torch.device) -> tuple[Callable[[Callable, bool], Results], Results]:
    """The chunk and recurrent ops: (run(fn, with_grad), reference results)."""
    inputs = gated_case(size, case.layout, case.regime, DTYPES[case.dtype], device, case.seed())
    leaves = (inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, inputs.initial_state)
    scale = size.K**-0.5
    chunk = case.op == "chunk_gated_delta_rule"

    def loss(o: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        return (o.double() * inputs.o_weight.double()).sum() + (final.double() * inputs.state_weight.double()).sum()

    def results(o, final, grads) -> Results:
        names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
        return {"o": o, "final_state": final, **dict(zip(names, grads or (None,) * 6, strict=True))}

    def run(fn: Callable, with_grad: bool) -> Results:
        wanted = chunk and with_grad
        q, k, v, g, beta, h0 = (t.detach().clone().requires_grad_(wanted) for t in leaves)
        extra = {"beta": beta} if not chunk else {}
        positional = (q, k, v, g) if not chunk else (q, k, v, g, beta)
        call = PREPARE[case.op](
            *positional,
            **extra,
            scale=scale,
            initial_state=h0,
            output_final_state=True,
            cu_seqlens=inputs.cu_seqlens,
            use_qk_l2norm_in_kernel=True,
        )
        with torch.set_grad_enabled(wanted):
            o, final = call.public_result(fn(call))
            grads = torch.autograd.grad(loss(o, final), (q, k, v, g, beta, h0)) if wanted else None
        return results(o, final, grads)

    q, k, v, g, beta, h0 = (t.detach().double().requires_grad_(chunk) for t in leaves)
    with torch.set_grad_enabled(chunk):
        o, final = reference.gated_delta(
            q, k, v, g, beta, scale=scale, initial_state=h0, cu_seqlens=inputs.cu_seqlens, l2norm=True
        )
        grads = torch.autograd.grad(loss(o, final), (q, k, v, g, beta, h0)) if chunk else None
    return run, results(o, final, grads)


def _decode(case: Case, size: Size, device: torch.device) -> tuple[Callable[[Callable, bool], Results], Results]:
    inputs = decode_case(size, case.regime, DTYPES[case.dtype], device, case.seed())
    live = (inputs.indices >= 0).nonzero().flatten()
    slots = inputs.indices[live].long()

    def run(fn: Callable, with_grad: bool) -> Results:
        pool = inputs.pool.clone()
        call = PREPARE[case.op](
            inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta, pool, inputs.indices, use_qk_l2norm_in_kernel=True
        )
        return {"o": fn(call), "pool": pool}

    o_live, states = reference.gated_delta(
        *(t[live] for t in (inputs.q, inputs.k, inputs.v, inputs.g, inputs.beta)),
        scale=size.K**-0.5,
        initial_state=inputs.pool[slots],
        l2norm=True,
    )
    o = torch.zeros(inputs.v.shape, dtype=torch.float64, device=device).index_copy(0, live, o_live)
    pool = inputs.pool.double().index_copy(0, slots, states)
    return run, {"o": o, "pool": pool}


def _conv(case: Case, size: Size, device: torch.device) -> tuple[Callable[[Callable, bool], Results], Results]:
    inputs = conv_case(size, case.op, DTYPES[case.dtype], device, case.seed())
    update = case.op == "causal_conv1d_update"
    pool_ref = inputs.pool.double().clone()
    outs = []
    if update:
        for b, slot in enumerate(inputs.indices.tolist()):
            out, pool_ref[slot] = reference.causal_conv(
                inputs.x[b, :, None], inputs.weight, inputs.bias, "silu", inputs.pool[slot]
            )
            outs.append(out[:, 0])
        out_ref = torch.stack(outs)
    else:
        bounds = inputs.query_start_loc.tolist()
        for n, slot in enumerate(inputs.indices.tolist()):
            history = inputs.pool[slot] if inputs.has_initial_state[n] else torch.zeros_like(inputs.pool[slot])
            out, pool_ref[slot] = reference.causal_conv(
                inputs.x[:, bounds[n] : bounds[n + 1]], inputs.weight, inputs.bias, "silu", history
            )
            outs.append(out)
        out_ref = torch.cat(outs, dim=-1)
    state_name = QUANTITIES[case.op][1]

    def run(fn: Callable, with_grad: bool) -> Results:
        pool = inputs.pool.clone()
        if update:
            call = PREPARE[case.op](
                inputs.x, pool, inputs.weight, inputs.bias, "silu", conv_state_indices=inputs.indices
            )
        else:
            call = PREPARE[case.op](
                inputs.x,
                inputs.weight,
                inputs.bias,
                activation="silu",
                query_start_loc=inputs.query_start_loc,
                conv_states=pool,
                cache_indices=inputs.indices,
                has_initial_state=inputs.has_initial_state,
            )
        return {"out": fn(call), state_name: pool}

    return run, {"out": out_ref, state_name: pool_ref}


def prepare(case: Case, size: Size, device: torch.device) -> tuple[Callable[[Callable, bool], Results], Results]:
    """(run a backend's implementation on the case, the reference's results)."""
    if case.op in CONV_OPS:
        return _conv(case, size, device)
    if case.op == "fused_recurrent_gated_delta_rule_update":
        return _decode(case, size, device)
    assert case.op in GATED_OPS
    return _gated(case, size, device)


# ---------------------------------------------------------------- rows


def unavailable(backends: dict[str, Backend], device_type: str) -> dict[str, str]:
    """The backends that declare the device but cannot run here, and why."""
    reasons = {name: b.why_unavailable(device_type) for name, b in backends.items() if device_type in b.devices}
    return {name: reason for name, reason in reasons.items() if reason is not None}


def serving(backends: dict[str, Backend], op: str, device_type: str) -> list[Backend]:
    """The backends that run here and implement the op (eager first)."""
    here = [b for b in backends.values() if device_type in b.devices and b.why_unavailable(device_type) is None]
    return sorted([b for b in here if b.implementation(op) is not None], key=lambda b: b.name != "eager")


def measure_row(
    case: Case, backend: Backend, device: torch.device, run: Callable[[Callable, bool], Results], ref: Results
) -> AccuracyRow:
    row = AccuracyRow(case.op, backend.name, case.dtype, "measured", case.regime, case.layout)
    row.route = backend.route_of(case.op)
    fn = backend.implementation(case.op)
    refused: list[str] = []

    def refusing(call):
        why = backend.refusal(case.op, call)
        if why is not None:
            refused.append(why)
            raise _RefusedError(why)
        # called directly, not through the resolver: the row's own call is noted as gdn notes a call
        kernel_log.note("gdn", case.op, call.dtype, row.route)
        return fn(call)

    log = kernel_log.ACTIVE
    mark = log.mark() if log is not None else None
    try:
        got = run(refusing, case.op not in backend.forward_only)
    except _RefusedError:
        row.status, row.reason = "refused", refused[0]
    except Exception as exc:  # a kernel that raises is a finding of the table, not a crash of it
        row.status, row.reason = "error", describe_error(exc)[:500]
    else:
        row.errors = {q: rel_err(got[q], ref[q]) for q in QUANTITIES[case.op] if got.get(q) is not None}
    if log is not None:
        row.kernels = kernel_counts(log.since(mark))
    return row


class _RefusedError(Exception):
    """The backend refused the case's call (its reason is kept by the row)."""


def measure(
    device: torch.device,
    backends: dict[str, Backend],
    size: Size,
    ops: tuple[str, ...] = OPS,
    budget_s: float | None = None,
    echo: Callable[[AccuracyRow], None] | None = None,
    dtypes: list[str] | None = None,
) -> list[AccuracyRow]:
    """Every case of `ops` (in `dtypes`, default all), every backend serving it here; once `budget_s` is
    spent, the rows not yet measured say so."""
    started = time.monotonic()
    rows = []
    for case in cases(ops, dtypes):
        candidates = serving(backends, case.op, device.type)
        if not candidates:
            continue
        spent = budget_s is not None and time.monotonic() - started > budget_s
        prepared = None if spent else prepare(case, size, device)
        for backend in candidates:
            if prepared is None or (budget_s is not None and time.monotonic() - started > budget_s):
                row = AccuracyRow(case.op, backend.name, case.dtype, "not_run", case.regime, case.layout)
                row.reason = f"the accuracy table's budget of {budget_s:g} s was spent"
            else:
                row = measure_row(case, backend, device, *prepared)
            rows.append(row)
            if echo is not None:
                echo(row)
    return rows
