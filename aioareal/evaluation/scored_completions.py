"""Completions of an evaluation set on the generation engine, scored by the reward service: the one
scoring path of held-out completions, for the in-run evaluation (run/evaluation.py) and `eval` alike.

The same path as training's (docs/architecture.md#data-flow): prompts go to the batched engine as
groups (G = 1 greedy, G = n sampled), finished groups go to the reward service, which holds every
check to its deadline and runs the task's verifier or the user's reward functions as training
does (`reward.functions`, `reward.weights`, `reward.isolation`, `reward.timeout_s`). Every prompt's
call is made at once, so a reward that hangs costs about one deadline per `reward.workers` prompts
(with `isolation=process`, one deadline in all: queued jobs expire at their call's deadline), never
a deadline per prompt."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import PreTrainedModel

from ..config import RewardConfig
from ..errors import one_line
from ..generation import EngineOptions, SamplingParams
from ..generation.backends import make_engine
from ..generation.forward import kv_bytes_per_token
from ..generation.turns import StopStrings
from ..group import Completion, Example, Group
from ..loops import run_coroutine
from ..rewards import build_scorer
from ..rewards.service import RewardService
from ..tasks import Task

MAX_SLOTS = 256  # KV-cache slots of one engine: enough to batch a whole small set at once
# The cache's bound: long prompts (lm-eval's 5-shot GSM8K, about 900 tokens) get fewer slots, so
# SmolLM2-135M in fp32 holds about 40 of them, not 256 (14 GB), on a machine of 24 GB.
KV_BUDGET_BYTES = 2 << 30
MIN_SHARED_PREFIX = 16  # tokens all prompts share before the engine computes them once (EngineOptions.prompt_prefix)
Progress = Callable[[int], None]  # called with the number of prompts just finished


@dataclass
class Scored:
    """One completion with its verdict."""

    text: str
    reward: float
    length: int  # completion tokens
    truncated: bool  # stopped by the length limit, not by an end-of-sequence token


def generate(model: PreTrainedModel, eos_ids: list[int], prompt_ids: Sequence[list[int]], examples: Sequence[Example],
             size: int, params: SamplingParams, seed: int, progress: Progress,
             backend: str = "auto", stop: StopStrings | None = None) -> list[list[Completion]]:
    """`size` completions of every prompt, in prompt order, by `backend` (generation.backend:
    generation/backends.py), each ending at EOS, the length limit or one of the `stop` strings;
    `progress` hears of each finished prompt."""
    max_len = max(len(p) for p in prompt_ids) + params.max_new_tokens
    fit = KV_BUDGET_BYTES // (max_len * kv_bytes_per_token(model, next(model.parameters()).dtype))
    slots = max(size, min(MAX_SLOTS, size * len(prompt_ids), fit))
    # fuse=False: the same model serves a greedy and a sampled engine in turn (generation/fusion.py).
    options = EngineOptions(slots, max_len, params, seed=seed, fuse=False, stop=stop,
                            prompt_prefix=tuple(common_prefix(prompt_ids)))
    engine = make_engine(model, eos_ids, options, backend)
    for i, (ids, example) in enumerate(zip(prompt_ids, examples)):
        engine.submit(Group(i, ids, size, example))
    done: dict[int, list[Completion]] = {}
    while engine.busy:
        finished = engine.step()
        for group in finished:
            done[group.group_id] = group.completions
        if finished:
            progress(len(finished))
    return [done[i] for i in range(len(prompt_ids))]


def common_prefix(prompts: Sequence[list[int]], least: int = MIN_SHARED_PREFIX) -> list[int]:
    """The token ids every prompt starts with, and goes past (empty when fewer than `least`):
    the few-shot context of lm-eval's prompts, a chat template's system turn."""
    if not prompts:
        return []
    first, n = prompts[0], min(len(p) for p in prompts) - 1
    for ids in prompts[1:]:
        n = next((i for i in range(n) if ids[i] != first[i]), n)
    return first[:n] if n >= least else []


def held_out_rewards(reward: RewardConfig, task: Task, decode: Callable[[list[int]], str]) -> RewardService:
    """The reward service that scores held-out completions: training's scorer, functions, weights,
    isolation, deadline, workers and memory limit. A service apart from training's, so that its
    failures are the evaluation's to count, and reward functions' values stay out of training's
    reward/<name> figures."""
    return RewardService(build_scorer(reward, task, tally=False), decode, reward.workers, reward.timeout_s,
                         memory_limit_mb=reward.memory_limit_mb)


def score(service: RewardService, completions: list[list[Completion]],
          examples: Sequence[Example]) -> tuple[list[list[Scored]], int]:
    """Every prompt's completions through the reward service (one call per prompt, all at once), as
    training scores a group: the token ids go in (TRL's `completion_ids` for reward functions) and
    the texts come back decoded. Returns the scored completions and how many checks failed (raised,
    hung or returned garbage: scored 0)."""
    if getattr(service.scorer, "worker_preload", None) is not None:
        # Workers still starting (or replacing ones killed at an earlier deadline) are charged to no
        # check: a call's deadline counts from its start, queued jobs' included.
        service.pool.wait_ready()

    async def one(group: list[Completion], example: Example) -> tuple[list[str], list[float], int]:
        decoded: list[list[str]] = []
        rewards, failures = await service.score([c.tokens for c in group], [example] * len(group), decoded)
        return (decoded[0] if decoded else [service.decode(c.tokens) for c in group]), rewards, failures

    async def all_groups() -> list[tuple[list[str], list[float], int]]:
        return await asyncio.gather(*(one(group, ex) for group, ex in zip(completions, examples)))
    results = run_coroutine(all_groups())  # beside a notebook's running loop too
    scored = [[Scored(text, reward, len(c.tokens), c.finish_reason == "length")
               for text, reward, c in zip(texts, rewards, group)]
              for (texts, rewards, _), group in zip(results, completions)]
    return scored, sum(failures for _, _, failures in results)


def failures_line(where: str, failures: int) -> str:
    """The warning both evaluations give when reward checks failed on held-out completions."""
    return one_line(f"warning: {where}: {failures:d} reward checks failed (raised, hung past "
                    "reward.timeout_s or returned garbage) and scored 0")
