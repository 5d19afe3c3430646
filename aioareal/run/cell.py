"""One rank's cell: what `run.train` builds differently under torchrun (DESIGN rule 7).

The config a rank runs is the job's with `algo.batch_groups` divided by the number of ranks:
each rank's admission gate, engine, buffer and trainer work on their B / N groups, exactly as one
process works on B, and the trainer's global reductions make the step the whole batch's.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..config import Config
from ..distributed.sharding import Mirror
from ..distributed.world import World
from ..errors import ConfigError
from ..tasks import Task
from .build import build_evaluator
from .evaluation import EvalSet
from .sharded_evaluation import Evaluator, shard_eval_set, sharded_evaluator

# Engine seeds of ranks > 0 are offset by this much, so ranks sample differently (rank 0 keeps the
# configured seed: a one-rank job samples as one process does).
RANK_SEED_STRIDE = 1_000_003


def cell_config(config: Config, world: World) -> Config:
    """The config this rank runs: B / N groups per step; the job's own when it is one process."""
    if not world.distributed:
        return config
    batch, ranks = config.algo.batch_groups, world.size
    if config.model.lora_rank:
        # The FSDP2 wrapping, the mirror and the sharded checkpoint all assume full fine-tuning.
        raise ConfigError("model.lora_rank", f"LoRA is not supported under torchrun yet; set model.lora_rank=0 "
                          f"or run one process, got {config.model.lora_rank}")
    if batch % ranks:
        raise ConfigError("algo.batch_groups", f"must be divisible by the number of ranks ({ranks}): each rank "
                          f"trains batch_groups / {ranks} whole groups (a group never splits across ranks), got {batch}")
    local = batch // ranks
    if local % config.algo.minibatches:
        raise ConfigError("algo.minibatches", f"must divide the groups each rank trains (algo.batch_groups / ranks "
                          f"= {local}), got {config.algo.minibatches}")
    return dataclasses.replace(config, algo=dataclasses.replace(config.algo, batch_groups=local),
                               dist=dataclasses.replace(config.dist, world_size=ranks))


def recorded(config: Config, world: World) -> Config:
    """The job's config as config.yaml records it: with the number of ranks it ran on."""
    return dataclasses.replace(config, dist=dataclasses.replace(
        config.dist, world_size=world.size if world.distributed else 0))


def engine_seed(config: Config, world: World) -> int:
    return config.run.seed + RANK_SEED_STRIDE * world.rank


def build_sharded_evaluator(config: Config, mirror: Mirror, trainer: Any, eval_set: EvalSet, task: Task,
                            decode: Callable[[list[int]], str], eos: list[int], world: World) -> Evaluator:
    """Every N-th held-out prompt on this rank, on the mirror's gathered weights; sums all-reduced."""
    shard = shard_eval_set(eval_set, world.rank, world.size)
    evaluate_shard = build_evaluator(config, mirror.model, shard, task, decode, eos)
    return sharded_evaluator(evaluate_shard, lambda: mirror.refresh(trainer.model), len(shard.examples),
                             trainer.collective)


class QuietLog:
    """The run log of ranks other than 0: rank 0 writes metrics.jsonl and samples.jsonl for all."""

    def step(self, row: dict[str, Any]) -> None:
        pass

    def samples(self, rows: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass
