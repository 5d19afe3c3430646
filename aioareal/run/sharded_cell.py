"""One torchrun rank's cell (docs/architecture.md rule 7): what differs from `LocalCell` when a process is one of N.

The config a rank runs is the job's with `algo.batch_groups` divided by the number of ranks: each
rank's admission gate, engine, buffer and trainer work on their B / N groups, exactly as one process
works on B, and the trainer's global reductions make the step the whole batch's. The trainer is one
FSDP2 shard; a `Mirror` keeps the full weights (gathered) for evaluation and the policy export. Rank
0 writes the outputs; steps are reported to every rank and a stop is settled between them
(rank_hooks.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from ..checkpoint import RunState
from ..checkpoint import sharded as sharded_checkpoint
from ..config import Config, to_dict
from ..devices import resolve_device
from ..distributed.world import Collective, Global, Mirror, World, shard_policy
from ..errors import ConfigError
from ..evaluation.scored_completions import EvalSet, KeptCompletions, build_evaluator, shard_eval_set, sharded_evaluator
from ..monitor.metrics import RunLog
from ..monitor.trackers import TrackerFeed, start_trackers
from ..orchestrator import Hooks, Orchestrator
from ..tasks import Task
from .events import SaveCheckpoint
from .rank_hooks import RankHooks, sharded_saver

T = TypeVar("T")

# Engine seeds of ranks > 0 are offset by this much, so ranks sample differently (rank 0 keeps the
# configured seed: a one-rank job samples as one process does).
RANK_SEED_STRIDE = 1_000_003


def cell_config(config: Config, world: World) -> Config:
    """The config rank `world.rank` runs: B / N groups per step."""
    batch, ranks = config.algo.batch_groups, world.size
    if config.model.lora_rank:
        # The FSDP2 wrapping, the mirror and the sharded checkpoint all assume full fine-tuning.
        raise ConfigError("model.lora_rank", f"LoRA is not supported under torchrun yet; set model.lora_rank=0 "
                          f"or run one process, got {config.model.lora_rank}")
    if batch % ranks:
        raise ConfigError("algo.batch_groups", f"must be divisible by the number of ranks ({ranks}): each rank "
                          f"trains batch_groups / {ranks} whole groups (a group never splits across ranks), "
                          f"got {batch}")
    local = batch // ranks
    if local % config.algo.minibatches:
        raise ConfigError("algo.minibatches", f"must divide the groups each rank trains (algo.batch_groups / ranks "
                          f"= {local}), got {config.algo.minibatches}")
    return dataclasses.replace(config, algo=dataclasses.replace(config.algo, batch_groups=local),
                               dist=dataclasses.replace(config.dist, world_size=ranks))


class QuietLog:
    """The run log of ranks other than 0: rank 0 writes metrics.jsonl and samples.jsonl for all."""

    def step(self, row: dict[str, Any]) -> None:
        pass

    def samples(self, rows: list[dict[str, Any]]) -> None:
        pass

    def eval_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        pass

    def close(self) -> None:
        pass


class ShardedCell:
    def __init__(self, world: World) -> None:
        self.world = world
        self.mirror: Mirror | None = None  # the full weights, copied from the model before sharding
        self.rank_hooks: RankHooks | None = None

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    def config(self, config: Config) -> Config:
        return cell_config(config, self.world)

    def recorded(self, config: Config) -> Config:
        return dataclasses.replace(config, dist=dataclasses.replace(config.dist, world_size=self.world.size))

    def main_decides(self, fn: Callable[[], T]) -> T:
        return self.world.main_decides(fn)

    def device(self, setting: str, side: str, config: Config) -> torch.device:
        return resolve_device(setting, side, (self.world.local_rank, config.rollout.devices_per_rank))

    def engine_seed(self, config: Config) -> int:
        return config.run.seed + RANK_SEED_STRIDE * self.world.rank

    def shard(self, policy: nn.Module, model: nn.Module, compute_dtype: torch.dtype) -> Collective:
        """FSDP2 over the ranks (after the mirror copied the full weights); sums become global."""
        self.mirror = Mirror(model)
        device = next(model.parameters()).device
        shard_policy(policy, model, device, compute_dtype)
        return Global(device)

    def evaluator(self, config: Config, trainer: Any, eval_set: EvalSet, task: Task,
                  decode: Callable[[list[int]], str], eos: list[int],
                  keep: KeptCompletions | None = None) -> Callable[[], dict[str, float]]:
        """Every N-th held-out prompt on this rank, on the mirror's gathered weights; sums all-reduced
        (the pass rate and length: pass@k is one process's figure). Rank 0 keeps its shard's
        completions for eval_samples.jsonl."""
        mirror = self._mirror()
        shard = shard_eval_set(eval_set, self.world.rank, self.world.size)
        evaluate_shard = build_evaluator(config.eval, config.generation, config.reward, config.run.seed,
                                         mirror.model, shard, task, decode, eos, keep if self.is_main else None)
        return sharded_evaluator(evaluate_shard, lambda: mirror.refresh(trainer.model), len(shard.examples),
                                 trainer.collective)

    def restore(self, path: Path, trainer: Any, engine: Any, config: Config) -> RunState:
        return sharded_checkpoint.restore(path, trainer, engine, self.world, config.algo.batch_groups)

    def run_log(self, run_dir: Path, resume_step: int | None) -> RunLog | QuietLog:
        return RunLog(run_dir, resume_step=resume_step) if self.is_main else QuietLog()

    def trackers(self, config: Config, run_dir: Path) -> TrackerFeed:
        return start_trackers(config.run, to_dict(config), run_dir) if self.is_main else TrackerFeed({})

    def saver(self, run_dir: Path, trainer_worker: Any, engine_generator: Any, tokenizer: Any,
              keep: int) -> SaveCheckpoint:
        return sharded_saver(run_dir, trainer_worker, engine_generator, self._mirror(), tokenizer, keep, self.world)

    def hooks(self, hooks: Hooks) -> Hooks:
        """Every rank's report gathered and merged; a stop asked on any rank stops all after one step."""
        self.rank_hooks = RankHooks(hooks, self.world)
        return self.rank_hooks

    def stop_target(self, orchestrator: Orchestrator) -> RankHooks:
        assert self.rank_hooks is not None, "hooks() comes first"
        return self.rank_hooks  # the ranks act on a signal together, after the same step

    def close(self) -> None:
        if self.rank_hooks is not None:
            self.rank_hooks.close()

    def _mirror(self) -> Mirror:
        assert self.mirror is not None, "the trainer is sharded (shard()) before the evaluator and saver are built"
        return self.mirror
