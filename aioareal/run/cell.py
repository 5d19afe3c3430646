"""The process shape, decided once (docs/architecture.md rule 7). A process is one *cell*: a generator device, a
trainer device, one event loop, one admission gate. `LocalCell` is the whole job in one process;
`ShardedCell` (sharded_cell.py) is one torchrun rank's cell of a larger job, its trainer one FSDP2
shard. `current_cell()` is the one place that asks which; setup, checkpoints, hooks and outputs ask
the cell they were given, so each difference between the two shapes is a method here, side by side.

How a run makes, scores and evaluates its samples is decided once too (data.episode, rule 9): single
completions or episodes. `rollout_kind` is the one place that asks; setup then builds one `Rollout`
(the generator, its scorer, the scorer's counters, the evaluator) and everything after it, the
orchestrator and cleanup, uses that record without asking again.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from .. import checkpoint
from ..checkpoint import RunState
from ..checkpoint import sharded as sharded_checkpoint
from ..config import Config, GenerationConfig, to_dict
from ..devices import resolve_device
from ..distributed.env import launched_by_torchrun, rank_number
from ..distributed.world import LOCAL, Collective, World, current, init, is_collective_failure, rank_error, teardown
from ..episodes import EpisodeSetup, EpisodeWorker, TurnQueue, codec_for, load_episode, stored_rewards
from ..errors import ConfigError, RunStopped, UserError
from ..evaluation.episode_eval import episode_evaluator
from ..evaluation.scored_completions import EvalSet, Evaluator, KeptCompletions, build_evaluator
from ..group import Example, Group
from ..monitor.metrics import RunLog
from ..monitor.trackers import TrackerFeed, start_trackers
from ..orchestrator import Hooks, Orchestrator
from ..orchestrator.workers import EngineWorker
from ..rewards.service import RewardService
from ..tasks import Task
from .events import SaveCheckpoint, Stoppable, checkpoint_saver

T = TypeVar("T")
Log = Callable[[str], None]


class Cell(Protocol):
    """What setup and the run ask about the process shape (`LocalCell`, `ShardedCell`)."""

    world: World

    @property
    def is_main(self) -> bool: ...  # writes the outputs and prints; every other rank is quiet
    def config(self, config: Config) -> Config: ...  # the config this process runs
    def recorded(self, config: Config) -> Config: ...  # the job's config as config.yaml records it
    def main_decides(self, fn: Callable[[], T]) -> T: ...
    def device(self, setting: str, side: str, config: Config) -> torch.device: ...
    def engine_seed(self, config: Config) -> int: ...
    def shard(self, policy: nn.Module, model: nn.Module, compute_dtype: torch.dtype) -> Collective: ...
    def evaluator(self, config: Config, trainer: Any, eval_set: EvalSet, task: Task,
                  decode: Callable[[list[int]], str], eos: list[int],
                  keep: KeptCompletions | None = None) -> Evaluator: ...
    def restore(self, path: Path, trainer: Any, engine: Any, config: Config) -> RunState: ...
    def run_log(self, run_dir: Path, resume_step: int | None) -> Any: ...
    def trackers(self, config: Config, run_dir: Path) -> TrackerFeed: ...
    def saver(self, run_dir: Path, trainer_worker: Any, engine_generator: Any, tokenizer: Any,
              keep: int) -> SaveCheckpoint: ...
    def hooks(self, hooks: Hooks) -> Hooks: ...
    def stop_target(self, orchestrator: Orchestrator) -> Stoppable: ...
    def close(self) -> None: ...


class LocalCell:
    """The whole job in one process: torch.distributed is never touched."""

    world = World()
    is_main = True

    def config(self, config: Config) -> Config:
        return config

    def recorded(self, config: Config) -> Config:
        return dataclasses.replace(config, dist=dataclasses.replace(config.dist, world_size=0))

    def main_decides(self, fn: Callable[[], T]) -> T:
        return fn()

    def device(self, setting: str, side: str, config: Config) -> torch.device:
        return resolve_device(setting, side)

    def engine_seed(self, config: Config) -> int:
        return config.run.seed

    def shard(self, policy: nn.Module, model: nn.Module, compute_dtype: torch.dtype) -> Collective:
        return LOCAL  # the trainer holds the whole model; its sums are its own

    def evaluator(self, config: Config, trainer: Any, eval_set: EvalSet, task: Task,
                  decode: Callable[[list[int]], str], eos: list[int],
                  keep: KeptCompletions | None = None) -> Evaluator:
        return build_evaluator(config.eval, config.generation, config.reward, config.run.seed, trainer.model, eval_set,
                               task, decode, eos, keep)

    def restore(self, path: Path, trainer: Any, engine: Any, config: Config) -> RunState:
        if (path / checkpoint.SHARDS).is_dir():  # written by several ranks: one process reads every shard
            return sharded_checkpoint.restore(path, trainer, engine, self.world, config.algo.batch_groups)
        return checkpoint.restore(path, trainer, engine)

    def run_log(self, run_dir: Path, resume_step: int | None) -> RunLog:
        return RunLog(run_dir, resume_step=resume_step)

    def trackers(self, config: Config, run_dir: Path) -> TrackerFeed:
        return start_trackers(config.run, to_dict(config), run_dir)

    def saver(self, run_dir: Path, trainer_worker: Any, engine_generator: Any, tokenizer: Any,
              keep: int) -> SaveCheckpoint:
        return checkpoint_saver(run_dir, trainer_worker, engine_generator, tokenizer, keep)

    def hooks(self, hooks: Hooks) -> Hooks:
        return hooks

    def stop_target(self, orchestrator: Orchestrator) -> Stoppable:
        return orchestrator  # a signal stops this process's orchestrator after its current step

    def close(self) -> None:
        pass


def cell_for(world: World) -> Cell:
    """The one place that asks whether this process is a torchrun rank."""
    if not world.distributed:
        return LocalCell()
    from .sharded_cell import ShardedCell  # FSDP2 and DCP load only under torchrun

    return ShardedCell(world)


def current_cell() -> Cell:
    return cell_for(current())


@contextlib.contextmanager
def session(config: Config) -> Iterator[World]:
    """Join the torchrun job for the length of a command. Under torchrun: initialise torch.distributed
    (NCCL bound to this rank's trainer GPU, or gloo) with `dist.timeout_s`, and turn a failed collective
    into a one-line error naming this rank. Without torchrun's variables: this process alone,
    torch.distributed untouched."""
    if not launched_by_torchrun():
        yield current()
        return
    slot = (rank_number("LOCAL_RANK"), config.rollout.devices_per_rank)
    device = resolve_device(config.rollout.train_device, "train", slot)
    world = init(config.dist.timeout_s, config.dist.backend, device)
    clean = False
    try:
        yield world
        clean = True
    except RunStopped:  # every rank stopped after the same step and checkpointed together
        clean = True
        raise
    except UserError:
        raise
    except Exception as e:
        if is_collective_failure(e):
            raise rank_error(world, e) from e
        raise
    finally:
        teardown(clean)


# -- the rollout kind (rule 9) ----------------------------------------------------------------------
@dataclass
class Rollout:
    """What generates, scores and evaluates this run, built once by a kind's `rollout`."""

    generator: EngineWorker | EpisodeWorker
    score: Callable[[Group], Awaitable[tuple[list[float], int]]]  # the orchestrator's scorer of a finished group
    counters: Callable[[], dict[str, float]]  # the scorer's running counts for each metrics row
    evaluator: Evaluator  # held-out evaluation, run on the trainer's thread

    def close(self) -> None:
        self.generator.close()


@dataclass
class EvalInputs:
    """What an evaluator is built from (the trainer's weights, the held-out set, its verdict)."""

    cell: Any  # cell.Cell: one process, or this rank's evaluation of its shard
    config: Config
    trainer: Any  # trainer.Trainer
    eval_set: EvalSet
    task: Task
    decode: Callable[[list[int]], str]
    eos: list[int]
    kept: KeptCompletions


class Completions:
    """Single completions: the engine worker generates a group, the reward service scores it."""

    def evaluator(self, given: EvalInputs) -> Evaluator:
        return given.cell.evaluator(given.config, given.trainer, given.eval_set, given.task, given.decode,
                                    given.eos, given.kept)

    def rollout(self, worker: EngineWorker, rewards: RewardService, evaluator: Evaluator) -> Rollout:
        return Rollout(worker, rewards.score_group,
                       lambda: {**rewards.stats.metrics(), **rewards.scorer_metrics()}, evaluator)


@dataclass
class Episodes:
    """Episodes: the episode worker drives the engine, episodes score themselves through the reward
    service and count their tools."""

    setup: EpisodeSetup
    generation: GenerationConfig
    eval_max_new_tokens: int | None  # eval.max_new_tokens (None: generation's)

    def evaluator(self, given: EvalInputs) -> Evaluator:
        budget = self.eval_max_new_tokens or self.generation.max_new_tokens
        return episode_evaluator(self.setup, given.trainer.model, given.eval_set, given.task.score, given.eos, budget,
                                 self.generation.backend)

    def rollout(self, worker: EngineWorker, rewards: RewardService, evaluator: Evaluator) -> Rollout:
        generator = episode_generator(self.setup, worker, rewards, self.generation.max_new_tokens)
        return Rollout(generator, stored_rewards, lambda: {**rewards.stats.metrics(), **generator.counters()},
                       evaluator)


def rollout_kind(config: Config, tokenizer: Any, chat: bool, ranks: int, log: Log) -> Completions | Episodes:
    """The one place that asks whether this run's samples are single completions or episodes
    (data.episode); every problem with the episodes is a one-line error now."""
    spec = config.data.episode
    if spec is None:
        return Completions()
    if ranks > 1:
        raise ConfigError("data.episode", "episodes are not supported under torchrun yet; run a single process")
    setup = EpisodeSetup(spec, load_episode(spec), codec_for(tokenizer, chat), config.tools,
                         config.data.episode_timeout_s, config.run.seed, log)
    tools = setup.toolbox()
    log(f"episodes: {spec}; tools {', '.join(tools.names) or 'none'}; observations written by "
        f"{setup.codec.check()}")
    return Episodes(setup, config.generation, config.eval.max_new_tokens)


def episode_generator(setup: EpisodeSetup, inner: EngineWorker, rewards: RewardService,
                      max_new_tokens: int) -> EpisodeWorker:
    """Training's generator: the engine worker driven by the episodes' turns, scoring through the
    reward service (its deadline, threads and worker processes, its failure counts)."""
    queue = TurnQueue(setup.codec.decode_raw)

    async def score(text: str, example: Example) -> tuple[float, bool]:
        scores, failures = await rewards.score([text], [example])
        return scores[0], failures > 0

    return EpisodeWorker(inner, setup.runner(queue, setup.toolbox(), score, max_new_tokens), queue)
