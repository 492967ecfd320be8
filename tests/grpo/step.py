"""One GRPO step: the clipped-ratio policy loss against the behaviour policy, a KL penalty to a frozen
reference model, an entropy bonus, gradient clipping and one optimizer step.

The optimizer is SGD, so the update is the (clipped) gradient times the learning rate and comparing
updates compares gradients. Adam's first step is lr * g / (|g| + eps), nearly sign(g): it would hide
gradient errors of a backend, yet flip whole steps where a gradient entry is near zero."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from grpo.rollout import Batch, Rollout

CLIP_EPS = 0.2
KL_COEF = 0.1
ENTROPY_COEF = 0.01
MAX_GRAD_NORM = 1.0
LR = 0.1


@dataclass
class StepResult:
    logprobs: torch.Tensor  # actor, per completion token, in rollout order
    ref_logprobs: torch.Tensor
    entropy: torch.Tensor  # per completion token
    loss: float
    pg_loss: float
    kl: float
    entropy_mean: float
    scales: dict[str, float]  # per scalar: how far it moves when the log-probs move by their own size
    clip_fraction: float  # tokens whose loss took the clipped branch
    grad_norm: float
    updates: dict[str, torch.Tensor]  # parameter name -> its change by the step

    def scalars(self) -> dict[str, float]:  # the step's scalars, by the names `scales` uses
        return {
            "loss": self.loss,
            "pg_loss": self.pg_loss,
            "kl": self.kl,
            "entropy": self.entropy_mean,
            "grad_norm": self.grad_norm,
        }


def token_logprobs(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each completion token and the entropy of the distribution it was drawn from."""
    logits = model(**batch.inputs).logits[batch.rows, batch.positions].float()
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, batch.targets[:, None]).squeeze(-1), entropy


def grpo_step(
    actor: torch.nn.Module,
    ref: torch.nn.Module,
    rollout: Rollout,
    batch: Batch,
    *,
    tokens: int | None = None,
    world: int = 1,
) -> StepResult:
    """The loss is a token mean over `tokens` (default: this batch's). In data-parallel training a rank
    passes the global token count and the world size: its scalars are then its share of the global
    ones, and its gradient is scaled to survive FSDP's averaging over ranks."""
    device = batch.targets.device
    tokens_per_sample = torch.tensor([len(c) for c in rollout.completions], device=device)
    tokens = int(tokens_per_sample.sum()) if tokens is None else tokens
    advantages = rollout.advantages().to(device).repeat_interleave(tokens_per_sample)
    old = rollout.sampler_logprobs.to(device)

    ref.eval()
    with torch.no_grad():
        ref_logprobs, _ = token_logprobs(ref, batch)
    actor.train()
    before = {name: _full(p).clone() for name, p in actor.named_parameters()}
    optimizer = torch.optim.SGD(actor.parameters(), lr=LR)
    optimizer.zero_grad()

    logprobs, entropy = token_logprobs(actor, batch)
    ratio = torch.exp(logprobs - old)
    clipped = ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS)
    pg = -torch.minimum(ratio * advantages, clipped * advantages)
    log_ref_ratio = ref_logprobs - logprobs
    kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1  # k3: unbiased, non-negative
    loss = (pg + KL_COEF * kl - ENTROPY_COEF * entropy).sum() / tokens
    (loss * world).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(actor.parameters(), MAX_GRAD_NORM)
    grad_norm = _full(grad_norm)
    optimizer.step()

    # First-order bounds: a log-prob error d_t moves pg by |A ratio| d_t and kl by |exp(r) - 1| d_t per
    # token, so a relative log-prob error e moves each mean by at most e times these scales.
    size = logprobs.detach().abs().mean()
    scales = {
        "pg_loss": ((ratio * advantages).abs().max() * size).item(),
        "kl": ((torch.exp(log_ref_ratio) - 1).abs().max() * size).item(),
        "entropy": entropy.detach().abs().mean().item(),
    }
    scales["loss"] = scales["pg_loss"] + KL_COEF * scales["kl"] + ENTROPY_COEF * scales["entropy"]
    scales["grad_norm"] = grad_norm.item()
    return StepResult(
        logprobs=logprobs.detach(),
        ref_logprobs=ref_logprobs,
        entropy=entropy.detach(),
        loss=loss.item(),
        pg_loss=(pg.sum() / tokens).item(),
        kl=(kl.sum() / tokens).item(),
        entropy_mean=(entropy.sum() / tokens).item(),
        scales=scales,
        clip_fraction=(clipped * advantages < ratio * advantages).float().mean().item(),
        grad_norm=grad_norm.item(),
        updates={name: _full(p) - before[name] for name, p in actor.named_parameters()},
    )


def on_host(step: StepResult) -> StepResult:
    """The step with its tensors on the host: steps of different devices or processes compare there."""
    values = {f.name: getattr(step, f.name) for f in dataclasses.fields(step)}
    tensors = {name: v.cpu() for name, v in values.items() if isinstance(v, torch.Tensor)}
    updates = {name: t.cpu() for name, t in step.updates.items()}
    return dataclasses.replace(step, **tensors, updates=updates)


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, detached; FSDP2 holds parameters (and the gradient norm) as sharded DTensors."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()
