"""The eager backend: every op in plain PyTorch. It is the fallback and the oracle the other
backends are probed against, so it needs no probe of its own."""

from __future__ import annotations

from dataclasses import dataclass, field

from gdn.backends.base import Backend, OpTable
from gdn.backends.eager import conv, gated_delta, pointwise
from gdn.backends.registry import Registration
from gdn.calls import SPECS

# every built-in op's implementation: the function of the op's name in one of these modules
OPS = {
    spec.name: getattr(module, spec.name)
    for spec in SPECS
    for module in (gated_delta, conv, pointwise)
    if hasattr(module, spec.name)
}


@dataclass(eq=False)
class EagerBackend(Backend):
    name: str = "eager"
    ops: OpTable | None = field(default_factory=lambda: dict(OPS))
    needs_probe: bool = False
    # cu_seqlens go into the block plan unchecked (sums that do not match the tokens give a wrong
    # answer, or an index error); the pooled ops read slots and offsets on the host and serve a bad row
    # NaN (gdn.pool_rows)
    trusts_values: frozenset[str] = frozenset({"chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"})
    compiles: bool = False  # torch's own kernels


EAGER = EagerBackend()
# the one instance the whole process shares: the oracle every probe compares with
REGISTRATION = Registration(name="eager", backend="EAGER", order=0)
