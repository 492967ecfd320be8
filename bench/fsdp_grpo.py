"""Tokens per second of one GRPO step (the step of tests/grpo/step.py: actor forward, backward and SGD
step, reference forward) on a Qwen3.5 text model past launch overhead: 8 layers (6 GDN, 2 full
attention), hidden 1024, 8 sequences of 2048 tokens (1024 prompt + 1024 completion), bf16. One GPU (the
plain models) against every visible GPU (up to 4: FSDP2 over NCCL, the 4 prompt groups split over the
ranks), eager against triton. Needs CUDA GPUs; elsewhere it says so and exits 0.

Each GPU count runs as one torchrun launch that times eager, then triton (a warm-up step first, which
also compiles and probes the kernels), and writes bench/results/fsdp-grpo-<date>.json.
Usage: PYTHONPATH=src:. python -m bench.fsdp_grpo [--steps N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from gdn.matrix.timing import environment, print_table, write_results

# The step, its batch layout, the sharding and the rank launcher are the grpo test family's.
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from grpo import launch

MODES = ("eager", "triton")
LAYERS = ["linear_attention"] * 3 + ["full_attention"]
CONFIG = dict(
    vocab_size=32768,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=8,
    layer_types=LAYERS * 2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    linear_num_key_heads=8,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
GROUPS, GROUP = 4, 2  # 8 sequences; ranks own whole groups (GRPO standardises rewards within a group)
PROMPT = COMPLETION = 1024
WARMUP = 1
STEPS = 3  # the whole run (launch, build, compile, both modes, 1 GPU and N) stays within ~4 min on an H200
RANK_TIMEOUT_S = 150


def synthetic_rollout():
    """Random prompts and completions with made-up behaviour log-probs: the step's cost does not
    depend on the tokens, and sampling 1024 tokens per sequence would cost more than the step."""
    from grpo.rollout import Rollout

    gen = torch.Generator().manual_seed(0)
    n = GROUPS * GROUP
    return Rollout(
        prompts=[torch.randint(1, CONFIG["vocab_size"], (PROMPT,), generator=gen) for _ in range(n)],
        completions=[torch.randint(1, CONFIG["vocab_size"], (COMPLETION,), generator=gen) for _ in range(n)],
        groups=[i // GROUP for i in range(n)],
        sampler_logprobs=-torch.rand(n * COMPLETION, generator=gen),
        step_logits=torch.empty(0, n, 0),
        sampled=torch.empty(n, 0, dtype=torch.long),
    )


def time_on_rank(out: Path, steps: int) -> None:
    """One rank: both models on its GPU (sharded when there are several ranks), then each mode timed."""
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh

    from gdn.integrations import transformers as gdn_transformers
    from grpo.fsdp_worker import rank_device, shard
    from grpo.rollout import padded
    from grpo.step import grpo_step

    dev = rank_device("nccl")
    dist.init_process_group("nccl")
    me, world = dist.get_rank(), dist.get_world_size()
    config = transformers.Qwen3_5TextConfig(**CONFIG)
    with dev:
        actor, ref = (transformers.Qwen3_5ForCausalLM(config).to(torch.bfloat16) for _ in range(2))
    ref.requires_grad_(False)
    if world > 1:
        mesh = init_device_mesh("cuda", (world,))
        shard(actor, mesh)
        shard(ref, mesh)
    rollout = synthetic_rollout()
    part = rollout.subset(rollout.share(me, world))
    batch = padded(part, dev)
    completion_tokens = sum(len(c) for c in rollout.completions)
    rows = []
    for mode in MODES:
        # Models built before patching are served too: the patch replaces what the layers look up per call.
        with gdn_transformers.patch(mode=mode):
            for _ in range(WARMUP):
                grpo_step(actor, ref, part, batch, tokens=completion_tokens, world=world)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            seconds = []
            for _ in range(steps):
                dist.barrier()
                start = time.perf_counter()
                grpo_step(actor, ref, part, batch, tokens=completion_tokens, world=world)
                torch.cuda.synchronize()
                dist.barrier()  # the step ends with the slowest rank's
                seconds.append(time.perf_counter() - start)
        step_s = statistics.median(seconds)
        tokens = GROUPS * GROUP * (PROMPT + COMPLETION)
        rows.append(
            {
                "gpus": world,
                "mode": mode,
                "step_ms": round(step_s * 1e3, 1),
                "tokens_per_s": round(tokens / step_s),
                "peak_gib_per_gpu": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            }
        )
    if me == 0:
        out.write_text(json.dumps(rows))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="timed steps per mode and GPU count")
    parser.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)  # set on the ranks torchrun starts
    args = parser.parse_args()
    if args.rank_out is not None:
        time_on_rank(args.rank_out, args.steps)
        return
    if not torch.cuda.is_available():
        print("bench.fsdp_grpo needs CUDA GPUs (NCCL); none here, nothing timed")
        return
    # Every rank trains on whole prompt groups: a GPU count that divides GROUPS.
    gpus = max(w for w in range(1, torch.cuda.device_count() + 1) if GROUPS % w == 0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in dict.fromkeys((1, gpus)):
            out = Path(tmp, f"{world}.json")
            target = ["-m", "bench.fsdp_grpo", "--steps", str(args.steps), "--rank-out", str(out)]
            status, output = launch.run(world, target, RANK_TIMEOUT_S)
            print(output, end="")
            if status != 0:
                why = f"ran past {RANK_TIMEOUT_S} s" if status is None else f"exited with {status}"
                raise SystemExit(f"bench.fsdp_grpo: the {world}-GPU ranks {why}")
            rows += json.loads(out.read_text())
    for row in rows:
        one_gpu = next(r for r in rows if r["gpus"] == 1 and r["mode"] == row["mode"])
        row["vs_1_gpu"] = round(row["tokens_per_s"] / one_gpu["tokens_per_s"], 2)
    env = environment()
    print_table(rows, ["gpus", "mode", "step_ms", "tokens_per_s", "vs_1_gpu", "peak_gib_per_gpu"])
    payload = {
        "environment": env,
        "gpus_visible": torch.cuda.device_count(),
        "model": {**CONFIG, "dtype": "bfloat16"},
        "batch": {"sequences": GROUPS * GROUP, "prompt": PROMPT, "completion": COMPLETION},
        "warmup_steps": WARMUP,
        "timed_steps": args.steps,
        "measure": (
            "median wall time of one GRPO step (reference forward, actor forward+backward, gradient clipping, "
            "SGD step; also the step's full-weight copies for its update record), ended by a barrier over "
            "the ranks; tokens_per_s counts every prompt and completion token of the global batch. "
            f"{args.steps} timed steps per row to keep the run within ~4 minutes on one H200."
        ),
        "rows": rows,
    }
    path = write_results("fsdp-grpo", payload)
    print(f"{env['card']}  torch {env['versions']['torch']}  written {path}")


if __name__ == "__main__":
    main()
