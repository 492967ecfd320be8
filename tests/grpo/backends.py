"""Which backend serves each patched op under a mode, and whether every GDN module of both models
really ran through gdn on it."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NoReturn

import pytest
import torch

import gdn
import gdn.resolve
from grpo.run import Run

# The ops a GRPO step reaches: the actor samples (prefill, then cached decode) and trains; the
# reference only scores.
ACTOR_OPS = ("chunk_gated_delta_rule", "causal_conv1d_fn", "fused_recurrent_gated_delta_rule", "causal_conv1d_update")
REFERENCE_OPS = ("chunk_gated_delta_rule", "causal_conv1d_fn")
# Comma-separated modes that this run exists to compare against eager (CI's interpreter sessions name
# triton): a case of theirs that would skip, xfail or fall back to eager fails instead, so a broken
# install or a probe rejection cannot pass as "compared".
EXPECT_ENV = "GDN_EXPECT_MODES"


def other_modes() -> list[str]:
    """Every mode but auto and eager: the backends a cell could compare against eager."""
    return [m for m in gdn.modes() if m not in (gdn.resolve.AUTO, gdn.resolve.EAGER)]


def expected_modes() -> frozenset[str]:
    """The modes EXPECT_ENV names. An unknown name is an error: a typo would otherwise expect nothing."""
    names = frozenset(name.strip() for name in os.environ.get(EXPECT_ENV, "").split(",") if name.strip())
    unknown = names - set(other_modes())
    if unknown:
        raise ValueError(f"{EXPECT_ENV} names {sorted(unknown)}; the modes compared against eager are {other_modes()}")
    return names


def not_compared(mode: str, reason: str, outcome: Callable[[str], NoReturn] = pytest.skip) -> NoReturn:
    """`outcome` (skip, or xfail) for a case of `mode` that cannot be compared here; a failure if this
    run expects the mode compared."""
    __tracebackhide__ = True  # reports point at the case, not here
    if mode in expected_modes():
        pytest.fail(f"{EXPECT_ENV} expects {mode} compared against eager, but it was not: {reason}")
    outcome(f"not compared: {reason}")


def resolve_under(mode: str, device: torch.device) -> dict[str, gdn.resolve.Resolution]:
    """Resolve (and so probe) every op the step uses under `mode`, before the run."""
    with gdn.resolve.compute_mode_override(mode):
        return {op: gdn.resolve.resolve(op, device) for op in ACTOR_OPS}


def describe(resolutions: dict[str, gdn.resolve.Resolution]) -> list[str]:
    lines = []
    for op, res in resolutions.items():
        notes = [f"{r.backend}: {r.reason}" for r in res.rejected]
        if res.forward_only:
            notes.append("forward only: calls that need gradients run eager")
        lines.append(f"{op} -> {res.route}" + (f" ({'; '.join(notes)})" if notes else ""))
    return lines


def unserved_modules(run: Run, resolutions: dict[str, gdn.resolve.Resolution]) -> list[str]:
    """A line per GDN module of the actor or the reference that did not run every op it needs through
    gdn on the route the resolver chose (so a model left unpatched is caught). Calls of a forward-only
    route that need gradients (the actor's training step) may run eager instead."""
    assert run.record is not None
    by_id = {m["id"]: m for m in run.record["modules"]}
    problems = []
    for model, ids in run.models.items():
        needed = ACTOR_OPS if model == "actor" else REFERENCE_OPS
        if not ids:
            problems.append(f"{model}: no GDN modules found")
        for i, module_id in enumerate(ids):
            calls = by_id.get(module_id, {}).get("calls", {})
            for op in needed:
                res = resolutions[op]
                allowed = {res.route, "eager"} if res.forward_only else {res.route}
                used = set(calls.get(op, {}))
                if res.route not in used or not used <= allowed:
                    problems.append(f"{model} GDN module {i}: {op} ran on {calls.get(op)}, expected {res.route}")
    return problems


def refused_ops(run: Run, resolutions: dict[str, gdn.resolve.Resolution]) -> dict[str, str]:
    """The ops whose backend refused every call of this run (a limit it declares, such as the dtypes
    it takes; gdn served those calls on the next candidate, as designed): op -> the refusals' reasons.
    Such a run compares nothing of that backend for those ops."""
    assert run.record is not None
    ran_on_route = {
        op
        for module in run.record["modules"]
        for op, used in module.get("calls", {}).items()
        if op in resolutions and resolutions[op].route in used
    }
    return {
        op: "; ".join(sorted(res.refusals))
        for op, res in resolutions.items()
        if res.refusals and op not in ran_on_route
    }


def comparison(
    mode: str, resolutions: dict[str, gdn.resolve.Resolution], not_compared: dict[str, str]
) -> dict[str, object]:
    """What a comparison of `mode` against eager compares: the ops `mode` serves (op -> route), the ops
    that fell back (op -> the backend that serves them and why) and the test's cases it did not compare
    (case -> why), as the report shows it beside the verdict ("fla compared on 1 of 4 ops")."""
    fell_back = {}
    for op, res in resolutions.items():
        if res.backend != mode:
            why = "; ".join(r.reason for r in res.rejected if r.backend == mode) or f"resolved to {res.backend}"
            fell_back[op] = f"{res.route}: {why}"
    compared = {op: res.route for op, res in resolutions.items() if res.backend == mode}
    return {"mode": mode, "compared": compared, "fell_back": fell_back, "not_compared": not_compared}
