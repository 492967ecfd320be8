"""One rank of the FSDP test, started by tests/ops/test_fsdp_grpo.py under torchrun:
`fsdp_worker.py OUT gloo|nccl MODE`. Over gloo the ranks run on the host; over NCCL each rank runs on
its own GPU (its LOCAL_RANK).

Every rank patches gdn in under MODE, builds the actor and the reference, shards both with FSDP2 (each
decoder layer, then the root), samples the whole rollout (identical on every rank: same seed, same
weights), and trains on its prompts' groups with the loss normalised by the global token count. Rank 0
saves what the ranks computed together: the rollout, the per-token quantities in rollout order, the
summed scalars, the full updates, and every rank's patch record with the ids of its models' GDN
modules, on the host."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from gdn.integrations import transformers as gdn_transformers
from grpo.rollout import padded, sample
from grpo.run import SEED, exact_fp32, models, module_ids
from grpo.step import grpo_step, on_host


def shard(model: torch.nn.Module, mesh: DeviceMesh) -> None:
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def rank_device(backend: str) -> torch.device:
    if backend == "nccl":
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        # NCCL's communicators, barrier included, work on the current device.
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def main(out: Path, backend: str, mode: str) -> None:
    dev = rank_device(backend)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    # Named, not left to fully_shard: its default mesh is on the accelerator when there is one, and it
    # would move the gloo ranks' shards to the GPU.
    mesh = init_device_mesh(dev.type, (world,))
    with exact_fp32(), gdn_transformers.patch(mode=mode) as handle:
        actor, ref = models("dense", dev)
        shard(actor, mesh)
        shard(ref, mesh)
        rollout = sample(actor, SEED)
        # FSDP2 keeps the root's parameters gathered after a forward that no backward follows; the
        # step's optimizer must be built over the sharded ones.
        actor.reshard()
        mine = rollout.share(rank, world)
        part = rollout.subset(mine)
        tokens = sum(len(c) for c in rollout.completions)
        step = on_host(grpo_step(actor, ref, part, padded(part, dev), tokens=tokens, world=world))
        served = {"record": handle.record(), "models": module_ids(actor, ref)}

    lengths = [len(c) for c in part.completions]
    per_token = {name: getattr(step, name).split(lengths) for name in ("logprobs", "ref_logprobs", "entropy")}
    shares: list = [None] * world
    dist.all_gather_object(shares, (mine, per_token, served))
    scalars = torch.tensor([step.loss, step.pg_loss, step.kl, step.entropy_mean], dtype=torch.float64, device=dev)
    dist.all_reduce(scalars)
    if rank == 0:
        by_sample = {i: (share[1], k) for share in shares for k, i in enumerate(share[0])}
        in_order = {
            name: torch.cat([by_sample[i][0][name][by_sample[i][1]] for i in range(len(rollout.completions))])
            for name in per_token
        }
        loss, pg_loss, kl, entropy = scalars.tolist()
        result = dataclasses.replace(step, **in_order, loss=loss, pg_loss=pg_loss, kl=kl, entropy_mean=entropy)
        torch.save(
            {
                "rollout": dataclasses.asdict(rollout),
                "step": dataclasses.asdict(result),
                "ranks": [share[2] for share in shares],
            },
            out,
        )
    # No rank may leave while another still talks to it: gloo aborts a process whose peer hung up.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
    # Everything is written and the group is gone: skip the interpreter's finalisation, where gloo's
    # worker threads can still drop tensors that need the GIL and abort the rank ("terminate called
    # without an active exception", seen on a loaded 2-core machine) after its work succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
