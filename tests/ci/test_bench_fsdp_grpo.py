"""bench/fsdp_grpo.py off the GPU: without CUDA GPUs it says so and writes nothing, and its batch splits
into whole prompt groups (finite advantages) for every GPU count it runs on."""

from __future__ import annotations

import sys

import pytest
import torch
from bench import fsdp_grpo

pytestmark = pytest.mark.tooling


def test_without_cuda_gpus_it_says_so_and_writes_nothing(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["fsdp_grpo"])

    def written(*_args):
        raise AssertionError("no results without GPUs")

    monkeypatch.setattr(fsdp_grpo, "write_results", written)
    fsdp_grpo.main()
    assert "needs CUDA GPUs" in capsys.readouterr().out


@pytest.mark.parametrize("world", [w for w in range(1, 9) if fsdp_grpo.GROUPS % w == 0])
def test_every_rank_trains_on_whole_prompt_groups(world):
    rollout = fsdp_grpo.synthetic_rollout()
    shares = [rollout.share(rank, world) for rank in range(world)]
    assert sorted(i for share in shares for i in share) == list(range(len(rollout.completions)))
    for share in shares:
        part = rollout.subset(share)
        assert part.completions, "a rank without samples would time nothing"
        assert torch.isfinite(part.advantages()).all()
