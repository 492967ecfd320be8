"""The numeric probe: before a non-eager backend serves an op, run it on small fresh random inputs
and compare it with eager by ||out - ref|| / ||ref||, for every output, every pool it writes and,
for training ops, every input gradient. NaN, Inf, all-zero output and errors over the tolerance
reject the backend: this is what catches kernels that are finite but wrong.

The gated-delta ops' cases take their compile-time class from the call that asked for the op first
(`ProbeClass`: input dtype, head counts, head dims, l2norm, which states the call passes): a kernel
binary is specialised on all of these, so the probe's first case compiles exactly the binaries that
call launches next, and the probe adds only its varlen cases' to a process's cold start."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gdn.calls import PREPARE, Call, GdnCall
from gdn.errors import describe_error
from gdn.op_specs import BY_NAME
from gdn.probe_cases import CASES, Case, ProbeClass

DEFAULT_TOLERANCE = 5e-3
# The least tolerance of a probe whose inputs are in half precision, per op: the chunk kernels keep
# intermediate tiles in the input dtype where eager keeps fp32; the recurrent kernel keeps its state in
# fp32 and rounds only what it writes. Measured under the interpreter (Triton 3.6, H = 2, HV = 4,
# K = V = 64 and 128), the worst output or gradient: chunk bf16 7.4e-3, fp16 5.8e-4; recurrent bf16
# 9.5e-5, fp16 2.2e-5. A wrong term costs far more.
HALF_PRECISION_TOLERANCE = {
    "chunk_gated_delta_rule": {torch.bfloat16: 2e-2, torch.float16: 5e-3},
    "fused_recurrent_gated_delta_rule": {torch.bfloat16: 1e-3, torch.float16: 1e-3},
}
GDN_OPS = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")


def probe_class(like: Call | None) -> ProbeClass:
    """The class of `like` where it is a gated-delta call; the small fp32 default otherwise."""
    if not isinstance(like, GdnCall):
        return ProbeClass()
    s = like.shapes
    dtype = None if like.q.dtype == torch.float32 else like.q.dtype
    state = like.initial_state
    state_dtype = None if state is None or state.dtype == torch.float32 else state.dtype
    has_state, l2norm = state is not None, like.use_qk_l2norm_in_kernel
    return ProbeClass(dtype, s.H, s.HV, s.K, s.V, l2norm, has_state, like.output_final_state, state_dtype)


@dataclass
class ProbeReport:
    passed: bool
    reason: str | None
    seed: int
    tolerance: float
    errors: dict[str, float] = field(default_factory=dict)
    # cases the backend refuses (gdn.resolve serves such calls elsewhere), by case name
    refused: dict[str, str] = field(default_factory=dict)
    # the gated-delta cases' class (ProbeClass.record); None for the other ops
    inputs: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        worst = max(self.errors.values(), default=None)
        return {
            "passed": self.passed,
            "reason": self.reason,
            "seed": self.seed,
            "tolerance": self.tolerance,
            "inputs": self.inputs,
            "max_rel_err": worst,
            "rel_err": self.errors,
            "refused": self.refused,
        }


def _cases(op: str, gen: torch.Generator, cls: ProbeClass) -> Iterator[Case]:
    cases = CASES.get(op)
    if cases is None:
        raise ValueError(f"numeric probe: unknown op {op!r}")
    yield from cases(gen, cls)


def _outputs(result: Any) -> list[torch.Tensor | None]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.double() - ref.double()).norm().item()
    scale = ref.double().norm().item()
    return diff / scale if scale > 0 else diff


def _arguments(case: Case, device: torch.device) -> dict[str, Any]:
    args = {k: (v.to(device).clone() if isinstance(v, torch.Tensor) else v) for k, v in case.args.items()}
    for name in case.grad:
        args[name].requires_grad_(True)
    return args


def _collect(op: str, fn: Callable, case: Case, device: torch.device) -> dict[str, torch.Tensor]:
    args = _arguments(case, device)
    call = PREPARE[op](**args)
    outputs = [t for t in _outputs(fn(call)) if t is not None]
    collected = {f"out{i}": t.detach() for i, t in enumerate(outputs)}
    for name in BY_NAME[op].mutates:  # what the op writes in place is compared as its outputs are
        if args.get(name) is not None:
            collected[name] = args[name].detach()
    if case.grad:
        gen = torch.Generator().manual_seed(len(case.name))
        upstream = [torch.randn(t.shape, generator=gen).to(device, t.dtype) for t in outputs]
        loss = sum((t * u).sum() for t, u in zip(outputs, upstream, strict=True))
        # An output with no autograd graph is a forward-only kernel: its missing gradients show up as
        # all-zero gradients below, after the outputs themselves have been judged.
        grads = (
            torch.autograd.grad(loss, [args[n] for n in case.grad], allow_unused=True)
            if loss.requires_grad
            else [None] * len(case.grad)
        )
        for name, grad in zip(case.grad, grads, strict=False):
            collected[f"d{name}"] = torch.zeros_like(args[name]) if grad is None else grad
    return collected


# States, pools and the log decay stay fp32 when the probe runs in half precision, as in the op contract.
FP32_INPUTS = frozenset({"g", "initial_state", "initial_states", "ssm_pool", "conv_states", "conv_state"})


def _in_dtype(case: Case, dtype: torch.dtype | None, state_dtype: torch.dtype | None = None) -> Case:
    """The case's inputs in `dtype` (the states in `state_dtype`, where given; else fp32, as the rest of
    FP32_INPUTS)."""

    def cast(name: str, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        if name == "initial_state" and state_dtype is not None:
            return value.to(state_dtype)
        return value if dtype is None or name in FP32_INPUTS else value.to(dtype)

    return replace(case, args={name: cast(name, value) for name, value in case.args.items()})


def probe_op(
    op: str,
    fn: Callable,
    device: torch.device,
    tolerance: float | None = None,
    *,
    eager: Callable,
    with_grad: bool = True,
    dtype: torch.dtype | None = None,
    head_dims: tuple[int, int] | None = None,
    like: Call | None = None,
    refusal: Callable[[Any], str | None] | None = None,
    outside_limits: tuple[int, int] | None = None,
    compile_ahead: Callable[[list[Any], Callable[[], object]], None] | None = None,
) -> ProbeReport:
    """Probe `fn`, a backend's implementation of `op`, against `eager`, the reference implementation
    (the eager backend's: the caller holds it, so that the probe stands below the backends).
    `like` is the call that asked for the op: the gated-delta cases take its class (probe_class),
    except that `dtype` and `head_dims`, where given, are what the backend takes and win (with the
    backend's tolerance for them); a half-precision class taken from the call raises the tolerance
    to HALF_PRECISION_TOLERANCE's at least.
    `refusal` is the backend's per-call refusal for this op: a case it refuses is recorded as
    refused and not compared; a backend that refuses every case fails. `outside_limits` (K, V) adds
    the first case again at head dims outside the backend's limits: refused there, the refusal is on
    record (a call of that shape never reaches the kernel); taken, it is compared like any case.
    `compile_ahead` receives the validated calls of every case the backend takes, once, before any case
    runs, and a function that computes every case's eager reference, to run while the backend's binaries
    compile."""
    cls = probe_class(like)
    if dtype is not None:
        cls = replace(cls, dtype=None if dtype == torch.float32 else dtype)
    if head_dims is not None:
        cls = replace(cls, K=head_dims[0], V=head_dims[1])
    tol = DEFAULT_TOLERANCE if tolerance is None else tolerance
    if dtype is None and op in GDN_OPS:  # a dtype the backend fixes comes with its own tolerance
        tol = max(tol, HALF_PRECISION_TOLERANCE[op].get(cls.dtype, 0.0))
    seed = int.from_bytes(os.urandom(4), "little")
    report = ProbeReport(passed=True, reason=None, seed=seed, tolerance=tol)
    report.inputs = cls.record() if op in GDN_OPS else None
    gen = torch.Generator().manual_seed(seed)
    cases = list(_cases(op, gen, cls))
    if outside_limits is not None:
        K, V = outside_limits
        first = next(_cases(op, gen, replace(cls, K=K, V=V)))
        cases.append(Case(f"{first.name} at K={K}, V={V}", first.args, first.grad))
    taken = []
    for case in cases:
        if case.fallback and taken:
            continue
        case = _in_dtype(case, cls.dtype, cls.state_dtype) if op in GDN_OPS else _in_dtype(case, dtype)
        if not with_grad:  # a forward-only kernel: compare outputs and pools only
            case = Case(case.name, case.args)
        call = PREPARE[op](**_arguments(case, device))
        why = None if refusal is None else refusal(call)
        if why is not None:
            report.refused[case.name] = why
        else:
            taken.append((case, call))
    refs: dict[str, dict[str, torch.Tensor]] = {}  # computed while the binaries compile, where they do

    def references() -> None:
        refs.update((case.name, _collect(op, eager, case, device)) for case, _ in taken)

    if compile_ahead is not None and taken:
        compile_ahead([call for _, call in taken], references)
    for case, _ in taken:
        ref = refs.pop(case.name, None) or _collect(op, eager, case, device)
        failure = _compare(report, op, ref, fn, case, device)
        if failure is not None:
            report.passed, report.reason = False, failure
            return report
    if not report.errors:
        report.passed = False
        report.reason = "every case refused: " + "; ".join(f"{n}: {r}" for n, r in report.refused.items())
    return report


def _compare(
    report: ProbeReport, op: str, ref: dict[str, torch.Tensor], fn: Callable, case: Case, device: torch.device
) -> str | None:
    """Run one case through fn and compare with its eager reference `ref`; record each output's error;
    the first failure, or None."""
    try:
        got = _collect(op, fn, case, device)
    except Exception as exc:
        return f"{case.name}: raised {describe_error(exc)}"
    for name, expected in ref.items():
        label = f"{case.name}.{name}"
        actual = got.get(name)
        if actual is None or actual.shape != expected.shape:
            return f"{label}: expected shape {list(expected.shape)}, got " + (
                "nothing" if actual is None else str(list(actual.shape))
            )
        if not torch.isfinite(actual).all():
            return f"{label}: contains NaN or Inf"
        if expected.abs().amax().item() > 0 and actual.abs().amax().item() == 0:
            return f"{label}: all zeros where eager is not"
        err = _rel_err(actual, expected)
        report.errors[label] = err
        if err > report.tolerance:
            return f"{label}: rel err {err:.3g} > {report.tolerance:.3g}"
    return None
