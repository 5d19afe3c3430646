"""One training step on a fixed global batch, in one process or on every rank of a torchrun job
(tests/distributed/test_distributed.py compares the two), then the new weights gathered into a generator copy.

    torchrun --nproc-per-node N tests/distributed_step.py OUT.pt [cuda] [fused-head]

Each rank trains groups rank, rank + N, ... of the batch, so that with algo.minibatches=2 every
mini-batch holds the same groups as one process's. Rank 0 saves the full parameters after the
step, the step's metrics, the number of filler micro-batches each rank added, and whether the
generator copy received exactly the trainer's weights. With `fused-head` no micro-batch keeps its
logits (`KEEP_LOGITS = 0`), so the log-probs go through the fused LM head
(trainer/logprobs.py), inside FSDP2's root unit when sharded.
"""
from __future__ import annotations

import math
import os
import random
import sys

import torch

from aioareal.config import load_config
from aioareal.distributed import world as worlds
from aioareal.distributed.world import full_tensor
from aioareal.group import Completion, Example, Group, Sample
from aioareal.run.build import build_models, build_trainer
from aioareal.run.cell import cell_for
from aioareal.trainer import logprobs, train_step
from aioareal.weightsync.full import WeightSync

# Small micro-batches so the ranks pack different numbers of them (fillers), clipping that bites,
# the decoupled objective's extra forward pass, and a KL reference.
OVERRIDES = ["model.name=random:tiny", "algo.batch_groups=4", "algo.group_size=4", "train.micro_batch_tokens=32",
             "algo.minibatches=2", "algo.objective=decoupled", "algo.kl_coef=0.1", "algo.grad_clip=0.05"]


def global_batch(groups: int = 4, size: int = 4) -> list[Group]:
    rng = random.Random(0)
    batch = []
    for g in range(groups):
        prompt = [rng.randrange(3, 60) for _ in range(rng.randrange(3, 8))]
        samples = []
        for _ in range(size):
            tokens = [rng.randrange(3, 60) for _ in range(rng.randrange(1, 3 + 5 * g))]
            completion = Completion(tokens, [-3 * rng.random() for _ in tokens], [0] * len(tokens), "stop")
            samples.append(Sample(prompt, completion, float(rng.random() < 0.5)))
        batch.append(Group(g, prompt, len(samples), Example(str(g), "", ""), samples=samples))
    return batch


def one_step(world: worlds.World, device: torch.device) -> dict:
    config = load_config(overrides=OVERRIDES)
    models = build_models(config, config.model.name, None, device, device)
    trainer = build_trainer(config, models, pad_id=0, shard=cell_for(world).shard)
    trainer.max_logprob_gap = math.inf  # hand-made behaviour log-probs come from no generator
    fillers = []
    pack = trainer.pack
    trainer.pack = lambda groups: _counted(pack(groups), fillers)
    sync = WeightSync(trainer.model, models.gen)
    metrics = train_step(trainer, global_batch()[world.rank::world.size], sync.publish)
    sync.apply(torch.cuda.current_stream(device) if device.type == "cuda" else None)
    params = {name: full_tensor(p).detach().float().cpu() for name, p in trainer.model.named_parameters()}
    generator = dict(models.gen.named_parameters())
    received = all(torch.equal(generator[name].detach().cpu(), value.to(generator[name].dtype))
                   for name, value in params.items())
    return {"params": params, "metrics": metrics, "fillers": world.all_gather(sum(fillers)),
            "generator_received": received}


def _counted(packed: list, fillers: list[int]) -> list:
    fillers.append(sum(mb.filler for part in packed for mb in part))
    return packed


if __name__ == "__main__":
    torch.set_num_threads(1)
    cuda = "cuda" in sys.argv[2:]
    if "fused-head" in sys.argv[2:]:
        logprobs.KEEP_LOGITS = 0
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    world = worlds.init(120, "auto", device)
    result = one_step(world, device)
    if world.is_main:
        torch.save(result, sys.argv[1])
    worlds.teardown(clean=True)
    # The result is on disk and the group is gone. Skip the interpreter's shutdown: in one CI run in
    # several, a rank aborted there ("terminate called without an active exception", SIGABRT) from
    # a native thread still joinable at exit, after the step had finished and been checked.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
