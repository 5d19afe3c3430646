"""Held-out evaluation of whole episodes (data.episode): each held-out example's episode run greedily
on the trainer's weights, its reward the pass, beside its tool calls and length (docs/episodes.md).
Single completions are scored in scored_completions.py."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from statistics import fmean

from transformers import PreTrainedModel

from ..episodes import EpisodeSetup, TurnQueue
from ..episodes.episode_worker import drive
from ..generation import EngineOptions, SamplingParams
from ..generation.backends import make_engine
from ..group import Example, Group
from .scored_completions import EvalSet


def episode_evaluator(setup: EpisodeSetup, model: PreTrainedModel, eval_set: EvalSet,
                      score: Callable[[str, Example], float], eos: list[int], budget: int,
                      backend: str = "auto") -> Callable[[], dict[str, float]]:
    """Held-out greedy pass rate of whole episodes on the trainer's weights (runs on its thread);
    `budget`: eval.max_new_tokens or generation.max_new_tokens, `backend`: generation.backend."""
    owner = getattr(score, "__self__", None)  # a RewardedTask's score counts its reward functions' failures

    def run() -> dict[str, float]:
        failed_before = getattr(owner, "failures", 0)
        metrics = evaluate_episodes(setup, model, eval_set, score, eos, budget, backend)
        if hasattr(owner, "failures"):
            metrics["eval_reward_failures"] = owner.failures - failed_before
        return metrics
    return run


def evaluate_episodes(setup: EpisodeSetup, model: PreTrainedModel, eval_set: EvalSet,
                      score: Callable[[str, Example], float], eos: list[int], budget: int,
                      backend: str = "auto", max_slots: int = 256) -> dict[str, float]:
    if not eval_set.examples:
        return {"eval_pass_rate": float("nan"), "eval_len_mean": 0.0}
    was_training = model.training
    max_len = max(len(p) for p in eval_set.prompt_ids) + budget
    # fuse=False: the trainer's own model (see scored_completions.py `evaluate`).
    options = EngineOptions(min(max_slots, len(eval_set.examples)), max_len,
                            SamplingParams(greedy=True, max_new_tokens=budget), fuse=False)
    engine = make_engine(model, eos, options, backend)
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
