"""Rollouts and the two layouts the training step sees them in.

A rollout is P prompts with G sampled completions each. Completion i is cut after
`max_new - i % 3` tokens, as an EOS would cut it, so that the padded batch has right padding as
well as the left padding of the prompts.

A backend under comparison replays the reference rollout's tokens instead of sampling its own: it
still runs the prefill and every cached decode step, and its logits there are compared, but a
backend of lower precision (bf16 kernels) cannot flip a sampled token and leave every later
comparison measuring two different rollouts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.models import PAD, VOCAB

PROMPTS = ([5, 17, 33, 2, 48, 9], [40, 3, 27])
GROUP = 2
MAX_NEW = 4
TEMPERATURE = 0.7


@dataclass
class Rollout:
    prompts: list[torch.Tensor]  # per sample, on the host
    completions: list[torch.Tensor]
    groups: list[int]  # the prompt each sample answers
    sampler_logprobs: torch.Tensor  # the behaviour policy's log-prob of every completion token, in order
    step_logits: torch.Tensor  # the raw logits of every sampling step [S, N, V], for comparisons
    sampled: torch.Tensor  # every sampled token [N, S], before the cuts: what a replay emits

    def subset(self, samples: list[int]) -> Rollout:
        """The given samples (a data-parallel rank's share), in the given order."""
        offsets = [0, *torch.tensor([len(c) for c in self.completions]).cumsum(0).tolist()]
        return Rollout(
            [self.prompts[i] for i in samples],
            [self.completions[i] for i in samples],
            [self.groups[i] for i in samples],
            torch.cat([self.sampler_logprobs[offsets[i] : offsets[i + 1]] for i in samples]),
            self.step_logits[:, samples],
            self.sampled[samples],
        )

    def share(self, rank: int, world: int) -> list[int]:
        """The samples data-parallel rank `rank` of `world` trains on: whole prompt groups, since the
        advantages are standardised within a group."""
        return [i for i, group in enumerate(self.groups) if group % world == rank]

    def rewards(self) -> torch.Tensor:
        """A deterministic toy reward: the mean token id of the completion, scaled to [0, 1)."""
        return torch.stack([c.double().mean() / VOCAB for c in self.completions]).float()

    def advantages(self) -> torch.Tensor:
        """GRPO: each reward standardised within its prompt's group."""
        rewards, groups = self.rewards(), torch.tensor(self.groups)
        out = torch.empty_like(rewards)
        for g in groups.unique():
            members = groups == g
            r = rewards[members]
            out[members] = (r - r.mean()) / (r.std() + 1e-6)
        return out


class _Replay:
    """A logits processor that makes `generate` emit the given tokens [N, S] (its raw logits, which
    are what gets compared, are left as the model made them)."""

    def __init__(self, tokens: torch.Tensor, prompt_width: int):
        self.tokens = tokens
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.prompt_width
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, self.tokens[:, step : step + 1].to(scores.device), 0.0)


@torch.no_grad()
def sample(model: torch.nn.Module, seed: int, replay: torch.Tensor | None = None) -> Rollout:
    """G completions per prompt from one batched, left-padded `generate` (prefill and cached decode):
    sampled, or the tokens of `replay` [N, S]."""
    from transformers import LogitsProcessorList

    device = next(model.parameters()).device
    width = max(map(len, PROMPTS))
    ids = torch.full((len(PROMPTS), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(PROMPTS):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    # Still sampling when replaying (greedy search cannot return several sequences per prompt): every
    # token but the replayed one has probability 0.
    replaying = [] if replay is None else [_Replay(replay, width)]
    model.eval()
    torch.manual_seed(seed)
    out = model.generate(
        ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=MAX_NEW,
        num_return_sequences=GROUP,
        pad_token_id=PAD,
        output_logits=True,
        return_dict_in_generate=True,
        do_sample=True,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        logits_processor=LogitsProcessorList(replaying),
    )
    step_logits = torch.stack(out.logits).float().cpu()  # [MAX_NEW, N, V]
    sampled = out.sequences[:, width:].cpu()
    steps = torch.log_softmax(step_logits / TEMPERATURE, dim=-1)
    prompts, completions, groups, logprobs = [], [], [], []
    for i in range(sampled.shape[0]):
        keep = MAX_NEW - i % 3
        prompts.append(torch.tensor(PROMPTS[i // GROUP]))
        completions.append(sampled[i, :keep])
        groups.append(i // GROUP)
        logprobs.append(steps[torch.arange(keep), i, sampled[i, :keep]])
    return Rollout(prompts, completions, groups, torch.cat(logprobs), step_logits, sampled)


@dataclass
class Batch:
    """Model inputs in one layout, and where each completion token's log-prob is read: the logits at
    (rows, positions) predict `targets`, in the rollout's token order."""

    inputs: dict[str, torch.Tensor | int | bool]
    rows: torch.Tensor
    positions: torch.Tensor
    targets: torch.Tensor


def padded(rollout: Rollout, device: torch.device) -> Batch:
    """One row per sample: prompts left-padded, completions right-padded, as verl lays them out."""
    p_width = max(len(p) for p in rollout.prompts)
    c_width = max(len(c) for c in rollout.completions)
    n = len(rollout.prompts)
    ids = torch.full((n, p_width + c_width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    rows, positions, targets = [], [], []
    for i, (prompt, completion) in enumerate(zip(rollout.prompts, rollout.completions, strict=True)):
        start = p_width - len(prompt)
        seq = torch.cat([prompt, completion])
        ids[i, start : start + len(seq)] = seq
        mask[i, start : start + len(seq)] = 1
        rows += [i] * len(completion)
        positions += range(p_width - 1, p_width - 1 + len(completion))
        targets += completion.tolist()
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False)
    return _batch(inputs, rows, positions, targets, device)


def packed(rollout: Rollout, device: torch.device) -> Batch:
    """Every sample's tokens back to back in one row, with the cu_seqlens offsets and restarting
    position ids that transformers' padding-free training passes (DataCollatorWithFlattening)."""
    seqs = [torch.cat([p, c]) for p, c in zip(rollout.prompts, rollout.completions, strict=True)]
    lengths = torch.tensor([len(s) for s in seqs])
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    rows, positions, targets = [], [], []
    for start, prompt, completion in zip(cu[:-1].tolist(), rollout.prompts, rollout.completions, strict=True):
        first = start + len(prompt) - 1
        rows += [0] * len(completion)
        positions += range(first, first + len(completion))
        targets += completion.tolist()
    longest = int(lengths.max())
    inputs = dict(
        input_ids=torch.cat(seqs)[None],
        position_ids=torch.cat([torch.arange(n) for n in lengths.tolist()])[None],
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=longest,
        max_length_k=longest,
        # Without a cache: transformers builds the block-diagonal mask of the full-attention layers from
        # the restarting position ids only when there is none.
        use_cache=False,
    )
    return _batch(inputs, rows, positions, targets, device)


def _batch(inputs: dict, rows: list, positions: list, targets: list, device: torch.device) -> Batch:
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    as_index = [torch.tensor(x, device=device) for x in (rows, positions, targets)]
    return Batch(moved, *as_index)


LAYOUTS = {"padded": padded, "packed": packed}
