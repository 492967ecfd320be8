"""One configuration of the mini-GRPO run: fresh actor and reference models, a rollout, one step,
under transformers' own GDN code (`TRANSFORMERS`) or with gdn patched in under a compute mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from gdn.integrations import transformers as gdn_transformers
from grpo.models import GDN_CLASS, build, device, gdn_modules, transformers_torch_code
from grpo.rollout import LAYOUTS, Rollout, sample
from grpo.step import StepResult, grpo_step

TRANSFORMERS = "transformers"  # not a gdn mode: the unpatched model
SEED = 1234
REF_DRIFT = 0.02  # the reference is the policy of a few steps ago: close, not equal (else KL = 0)


@dataclass
class Run:
    rollout: Rollout
    step: StepResult
    record: dict[str, Any] | None  # the patch record; None for TRANSFORMERS
    models: dict[str, list[int]]  # "actor" / "reference" -> ids of its GDN modules


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """TF32 off: on GPUs it would make even the eager reference differ from fp32 by ~1e-3."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def models(kind: str, dev: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The actor, and the reference: the same model a little way back along its training."""
    actor, ref = build(kind, SEED, dev), build(kind, SEED, dev)
    gen = torch.Generator(device="cpu").manual_seed(SEED + 1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(REF_DRIFT * torch.randn(p.shape, generator=gen).to(p.device))
    ref.requires_grad_(False)
    return actor, ref


def run(
    kind: str, layout: str, backend: str, dev: torch.device | None = None, replay: torch.Tensor | None = None
) -> Run:
    """`replay`: the sampled tokens of the run to compare with (see grpo.rollout)."""
    dev = device() if dev is None else dev
    code = transformers_torch_code() if backend == TRANSFORMERS else contextlib.nullcontext()
    patched = contextlib.nullcontext() if backend == TRANSFORMERS else gdn_transformers.patch(mode=backend)
    with exact_fp32(), code, patched as handle:
        actor, ref = models(kind, dev)
        rollout = sample(actor, SEED, replay)
        step = grpo_step(actor, ref, rollout, LAYOUTS[layout](rollout, dev))
        record = None if handle is None else handle.record()
    return Run(rollout, step, record, module_ids(actor, ref))


def module_ids(actor: torch.nn.Module, ref: torch.nn.Module) -> dict[str, list[int]]:
    """The ids of each model's GDN modules, as the patch record names them."""
    models = {"actor": actor, "reference": ref}
    return {name: [id(m) for m in gdn_modules(model).values()] for name, model in models.items()}


def packing_blocker(kind: str) -> str | None:
    """Why this transformers cannot train packed sequences through `kind`'s GDN layers, or None."""
    with gdn_transformers.patch(mode="eager") as handle:
        record = handle.record()
    if record["classes"][GDN_CLASS[kind]]["packed_sequences"]:
        return None
    return (
        f"transformers {record['transformers']}: {GDN_CLASS[kind]} never receives the packed-sequence offsets "
        "(cu_seq_lens_q), so no backend can keep packed sequences apart there"
    )
