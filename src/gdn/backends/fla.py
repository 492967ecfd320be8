"""The `fla` backend: an adapter for flash-linear-attention (import package `fla`, distribution
fla-core), a peer under test and never a requirement.

It serves CUDA GPUs (after our own `triton` backend in auto) and Ascend NPUs, where fla runs its
triton-ascend kernels (after `ascendc` and `triton`). Route: "fla:<fla version>".

fla >= 0.6 takes our layout as is: q, k [B, T, H, K], v [B, T, HV, V] with grouped value heads
(HV a multiple of H), g and beta [B, T, HV], states [N, HV, K, V], varlen through cu_seqlens with
B = 1. Everything after v is passed by keyword: fla's fused_recurrent_gated_delta_rule has gk and
gv between g and beta, so a positional beta would land in gk.

fla 0.6.0 refuses its gated backward on Hopper with Triton >= 3.4.0 and < 3.7.1 (RuntimeError
"... produces incorrect results for gated chunk_bwd_dqkwg (see #640) ..."). The numeric probe runs
the backward, so there the backend is rejected with that message and the resolver falls back; it
is not worked around. `bypass_hopper_guard` lifts the guard for benchmarks that time fla's kernels,
whose gradients are then not to be trusted.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from gdn.backends import fla_dispatch
from gdn.backends.base import Backend, OpTable, import_version
from gdn.backends.findings import Section, distribution, imported, mark_stand_in
from gdn.backends.registry import Registration
from gdn.calls import GdnCall, L2NormCall
from gdn.gates import floored

NAME = "fla"
REGISTRATION = Registration(
    name="fla",
    backend="FlaBackend",
    order=30,
    versions={
        "fla": ("fla", "distribution", "version"),
        # what fla's own dispatch hands its chunk op to, beside it (fla's section lists them)
        "flash_qla": ("fla", "peer_packages", "flash-qla"),
        "tilelang": ("fla", "peer_packages", "tilelang"),
    },
)
DISTRIBUTIONS = ("fla-core", "flash-linear-attention")
# what fla's dispatch depends on: FlashQLA's kernels (flash-qla on tilelang, which needs z3-solver)
PEER_DISTRIBUTIONS = ("flash-qla", "tilelang", "z3-solver", "apache-tvm-ffi")
# The probe runs fp32 inputs. Most of fla's tl.dot calls keep Triton's default TF32 (operands rounded to
# 10 mantissa bits, about 5e-4 relative each); through the triangular solve, the state pass and the
# backward chains that grows to 1e-3-2e-3, and a wrong term costs far more than 5e-3. l2norm has no
# matmul: a few fp32 ulps.
PROBE_TOLERANCE = {"l2norm": 1e-5, "chunk_gated_delta_rule": 5e-3, "fused_recurrent_gated_delta_rule": 5e-3}


def _load() -> OpTable:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent

    def chunk_gated_delta_rule(call: GdnCall):
        # fla's chunk kernels take differences of cumulative gates: a -inf gate is raised to the floor
        # first (gdn.gates); its recurrent kernel takes exp(g) per token, -inf as it is
        return fla_chunk(call.q, call.k, call.v, **_fla_kwargs(call, floored(call.g)))

    def fused_recurrent_gated_delta_rule(call: GdnCall):
        return fla_recurrent(call.q, call.k, call.v, **_fla_kwargs(call, call.g))

    ops: dict = {
        "chunk_gated_delta_rule": chunk_gated_delta_rule,
        "fused_recurrent_gated_delta_rule": fused_recurrent_gated_delta_rule,
    }
    try:
        from fla.modules.l2norm import l2norm as fla_l2norm
    except ImportError:
        pass  # older or trimmed fla builds: the op is simply not offered
    else:

        def l2norm(call: L2NormCall) -> torch.Tensor:
            return fla_l2norm(call.x, eps=call.eps)

        ops["l2norm"] = l2norm
    return ops


def _fla_kwargs(call: GdnCall, g: torch.Tensor) -> dict:
    """Our validated call, with the gates `g`, as fla's keyword arguments after v (shapes need no
    translation: fla reads them off the tensors, and GdnShapes already checked they agree)."""
    return dict(
        g=g,
        beta=call.beta,
        scale=call.scale,
        initial_state=call.initial_state,
        output_final_state=call.output_final_state,
        # fla declares LongTensor; our contract also admits int32.
        cu_seqlens=None if call.cu_seqlens is None else call.cu_seqlens.long(),
        use_qk_l2norm_in_kernel=call.use_qk_l2norm_in_kernel,
    )


@dataclass(eq=False)
class FlaBackend(Backend):
    name: str = NAME
    devices: tuple[str, ...] = ("cuda", "npu")
    auto_rank: Mapping[str, int] = field(default_factory=lambda: {"cuda": 1, "npu": 2})
    probe_tolerance: Mapping[str, float] = field(default_factory=lambda: PROBE_TOLERANCE)
    # fla's kernels read cu_seqlens on the device unchecked
    trusts_values: frozenset[str] = frozenset({"chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"})
    peer: bool = True

    def loader(self) -> OpTable:
        return _load()

    def route(self, op: str) -> str:
        return f"{NAME}:{import_version('fla')}"

    def watch(self) -> AbstractContextManager[bool]:
        return fla_dispatch.watching()

    def describe(self) -> dict[str, Callable[[], Any]]:
        return {"fla": fla_section}

    @contextlib.contextmanager
    def timing(self, op: str) -> Iterator[str | None]:
        """fla's Hopper guard lifted around its chunk rows where it blocks them (timing only)."""
        if op != "chunk_gated_delta_rule" or not hopper_guard_blocks():
            yield None
            return
        with bypass_hopper_guard():
            yield "fla's Hopper guard lifted for timing: its gated backward is wrong with this Triton here"


def fla_section() -> Section:
    """fla's version, whether it imports (tilelang without z3-solver breaks `import fla`), the versions
    of the packages that change which kernel fla runs, and that kernel, from fla's own registry."""
    fla, import_found = imported("fla")
    section: Section = {
        "distribution": distribution(*DISTRIBUTIONS),
        "import": import_found,
        "peer_packages": {name: (distribution(name) or {}).get("version") for name in PEER_DISTRIBUTIONS},
    }
    if fla is None:
        return section
    mark_stand_in(section, fla)
    section["flash_qla_import"] = imported("flash_qla")[1] if section["peer_packages"]["flash-qla"] else None
    section["dispatch"] = fla_dispatch.describe()
    return section


@functools.cache
def hopper_guard_blocks() -> bool:
    """Whether fla's Hopper guard blocks its gated backward here (for bf16 chunk calls)."""
    try:
        described = fla_dispatch.describe_dtype(torch.bfloat16)
    except Exception:  # fla does not import: its resolution says why
        return False
    return bool(described["hopper_guard"]["blocks_gated_backward"])


@contextlib.contextmanager
def bypass_hopper_guard() -> Iterator[bool]:
    """TIMING ONLY: lift fla's refusal to run its gated backward on Hopper with Triton >= 3.4.0 and
    < 3.7.1, for as long as the block runs. fla refuses because that backward computes wrong
    gradients there (fla #640): use it to time kernels, never to train or to check numbers. Yields
    whether a guard was lifted (False for fla builds without it)."""
    from fla.ops.common import chunk_o

    if not hasattr(chunk_o, "TRITON_ABOVE_3_7_1"):
        yield False
        return
    saved = chunk_o.TRITON_ABOVE_3_7_1
    chunk_o.TRITON_ABOVE_3_7_1 = True  # the guard fires only when this is False
    try:
        yield True
    finally:
        chunk_o.TRITON_ABOVE_3_7_1 = saved
