"""How a run makes, scores and evaluates its samples, decided once (data.episode): single completions
or episodes (docs/architecture.md rule 9). `rollout_kind` is the one place that asks; setup then builds
one `Rollout` (the generator, its scorer, the scorer's counters, the evaluator) and everything after
it, the orchestrator and cleanup, uses that record without asking again."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from transformers import PreTrainedModel

from ..config import Config
from ..episodes import (
    Codec,
    Episode,
    EpisodeContext,
    EpisodeRunner,
    EpisodeWorker,
    TurnQueue,
    codec_for,
    load_episode,
    stored_rewards,
)
from ..episodes.episode_worker import drive
from ..errors import ConfigError
from ..evaluation.scored_completions import EvalSet, Evaluator, KeptCompletions
from ..generation import EngineOptions, SamplingParams
from ..generation.backends import make_engine
from ..group import Example, Group
from ..orchestrator.workers import EngineWorker
from ..rewards.service import RewardService
from ..tasks.base import Task
from ..tools import ToolBox, ToolThreads, build_toolbox

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


@dataclass(frozen=True)
class EpisodeSetup:
    spec: str  # data.episode as configured
    episode: Episode
    codec: Codec
    config: Config
    log: Log = print  # where an episode's first failure is shown
    # One per run: training's box and every evaluation's share its threads (ToolThreads).
    tool_threads: ToolThreads = field(init=False)

    eval_log: Log = field(init=False)  # the run's log, for the first evaluation failure of the run only

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_threads", ToolThreads(self.config.tools.max_threads))
        shown: list[str] = []

        def first_only(line: str) -> None:  # every evaluation fails alike: one account is enough
            if not shown:
                shown.append(line)
                self.log(line)
        object.__setattr__(self, "eval_log", first_only)

    def toolbox(self, seed_offset: int = 0) -> ToolBox:
        """A box of the configured tools with counters of its own (training and evaluation keep apart)
        and the run's threads."""
        t = self.config.tools
        return build_toolbox(t.names, t.functions, t.timeout_s, t.latency_ms, self.config.run.seed + seed_offset,
                             t.max_threads, self.tool_threads)

    def runner(self, queue: TurnQueue, tools: ToolBox, score: Any, budget: int,
               log: Log | None = None, name: str | None = None) -> EpisodeRunner:
        ctx = EpisodeContext(queue, self.codec, tools, score, budget, self.config.tools.max_calls)
        return EpisodeRunner(self.episode, ctx, self.config.data.episode_timeout_s, name or f"episode '{self.spec}'",
                             log or self.log)


    def evaluator(self, given: EvalInputs) -> Evaluator:
        return episode_evaluator(self, given.trainer.model, given.eval_set, given.task.score, given.eos)

    def rollout(self, worker: EngineWorker, rewards: RewardService, evaluator: Evaluator) -> Rollout:
        """Episodes score themselves (through the reward service) and count their tools."""
        generator = episode_generator(self, worker, rewards)
        return Rollout(generator, stored_rewards, lambda: {**rewards.stats.metrics(), **generator.counters()},
                       evaluator)


def rollout_kind(config: Config, tokenizer: Any, chat: bool, ranks: int, log: Log) -> Completions | EpisodeSetup:
    """The one place that asks whether this run's samples are single completions or episodes
    (data.episode); every problem with the episodes is a one-line error now."""
    spec = config.data.episode
    if spec is None:
        return Completions()
    if ranks > 1:
        raise ConfigError("data.episode", "episodes are not supported under torchrun yet; run a single process")
    setup = EpisodeSetup(spec, load_episode(spec), codec_for(tokenizer, chat), config, log)
    tools = setup.toolbox()
    log(f"episodes: {spec}; tools {', '.join(tools.names) or 'none'}; observations written by "
        f"{setup.codec.check()}")
    return setup


def episode_generator(setup: EpisodeSetup, inner: EngineWorker, rewards: RewardService) -> EpisodeWorker:
    """Training's generator: the engine worker driven by the episodes' turns, scoring through the
    reward service (its deadline, threads and worker processes, its failure counts)."""
    queue = TurnQueue(setup.codec.decode_raw)

    async def score(text: str, example: Example) -> tuple[float, bool]:
        scores, failures = await rewards.score([text], [example])
        return scores[0], failures > 0

    return EpisodeWorker(inner, setup.runner(queue, setup.toolbox(), score, setup.config.generation.max_new_tokens),
                         queue)


def episode_evaluator(setup: EpisodeSetup, model: PreTrainedModel, eval_set: EvalSet,
                      score: Callable[[str, Example], float], eos: list[int]) -> Callable[[], dict[str, float]]:
    """Held-out greedy pass rate of whole episodes on the trainer's weights (runs on its thread)."""
    budget = setup.config.eval.max_new_tokens or setup.config.generation.max_new_tokens
    owner = getattr(score, "__self__", None)  # a RewardedTask's score counts its reward functions' failures

    def run() -> dict[str, float]:
        failed_before = getattr(owner, "failures", 0)
        metrics = evaluate_episodes(setup, model, eval_set, score, eos, budget)
        if hasattr(owner, "failures"):
            metrics["eval_reward_failures"] = owner.failures - failed_before
        return metrics
    return run


def evaluate_episodes(setup: EpisodeSetup, model: PreTrainedModel, eval_set: EvalSet,
                      score: Callable[[str, Example], float], eos: list[int], budget: int,
                      max_slots: int = 256) -> dict[str, float]:
    if not eval_set.examples:
        return {"eval_pass_rate": float("nan"), "eval_len_mean": 0.0}
    was_training = model.training
    max_len = max(len(p) for p in eval_set.prompt_ids) + budget
    # fuse=False: the trainer's own model (see evaluation/scored_completions.py `evaluate`).
    options = EngineOptions(min(max_slots, len(eval_set.examples)), max_len,
                            SamplingParams(greedy=True, max_new_tokens=budget), fuse=False)
    engine = make_engine(model, eos, options, setup.config.generation.backend)
    queue = TurnQueue(setup.codec.decode_raw)

    async def scored(text: str, example: Example) -> tuple[float, bool]:
        # Off this loop: `score` may wait up to reward.timeout_s for a user's reward function.
        return await asyncio.to_thread(score, text, example), False

    tools = setup.toolbox(seed_offset=1)
    # The run's log, named: an episode that fails here (raises, hangs, blocks the loop) would
    # otherwise cost the evaluation its timeout per row with nothing said (the run's first shown).
    runner = setup.runner(queue, tools, scored, budget, setup.eval_log, f"held-out evaluation: episode '{setup.spec}'")
    groups = [Group(i, ids, 1, example) for i, (ids, example) in enumerate(zip(eval_set.prompt_ids, eval_set.examples))]
    try:
        outcomes = asyncio.run(drive(engine, queue, [runner.run_group(g) for g in groups]))
    finally:
        tools.close()
    model.train(was_training)
    completions = [g.completions[0] for g in groups]
    return {"eval_pass_rate": fmean(rewards[0] for rewards, _ in outcomes),
            "eval_len_mean": fmean(len(c.tokens) for c in completions),
            "eval_tool_calls_mean": fmean(len(c.tool_calls) for c in completions),
            "eval_episode_errors": runner.stats.errors}
