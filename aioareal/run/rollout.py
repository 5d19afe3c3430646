"""How a run makes, scores and evaluates its samples, decided once (data.episode): single completions
or episodes (docs/architecture.md rule 9). `rollout_kind` is the one place that asks; setup then builds
one `Rollout` (the generator, its scorer, the scorer's counters, the evaluator) and everything after
it, the orchestrator and cleanup, uses that record without asking again."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..config import Config, GenerationConfig
from ..episodes import (
    EpisodeSetup,
    EpisodeWorker,
    TurnQueue,
    codec_for,
    load_episode,
    stored_rewards,
)
from ..errors import ConfigError
from ..evaluation.episode_eval import episode_evaluator
from ..evaluation.scored_completions import EvalSet, Evaluator, KeptCompletions
from ..group import Example, Group
from ..orchestrator.workers import EngineWorker
from ..rewards.service import RewardService
from ..tasks.base import Task

Log = Callable[[str], None]


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
