"""Held-out evaluation: completions of an evaluation set on the generation engine, scored by the
reward service, the one scoring path of held-out completions for `eval` and the in-run evaluation
alike; then the in-run evaluator built on it.

The same path as training's (docs/architecture.md#data-flow): prompts go to the batched engine as
groups (G = 1 greedy, G = n sampled), finished groups go to the reward service, which holds every
check to its deadline and runs the task's verifier or the user's reward functions as training
does (`reward.functions`, `reward.weights`, `reward.isolation`, `reward.timeout_s`). Every prompt's
call is made at once, so a reward that hangs costs about one deadline per `reward.workers` prompts
(with `isolation=process`, one deadline in all: queued jobs expire at their call's deadline), never
a deadline per prompt.

The in-run evaluation (`build_evaluator`, run on the trainer's thread) decodes every held-out prompt
greedily (and with eval.samples, that many sampled completions a prompt: pass@k in the metrics). On
several ranks each rank scores every N-th held-out prompt on the full weights (gathered into its
`Mirror`), and the sums are all-reduced, so every rank reports the pass rate of the whole held-out
set, as one process would (`shard_eval_set`, `sharded_evaluator`).

The figures of an evaluation, from per-prompt verdicts (`sampled_figures`, pure functions):

- pass@k: the unbiased estimator of Chen et al. 2021 (Codex, eq. 1): with n samples of a prompt of
  which c pass, the chance that k drawn without replacement hold at least one pass,
  1 - C(n-c, k) / C(n, k), computed as a product to stay exact for large n.
- maj@k: the majority answer among a prompt's first k samples (samples without an answer do not
  vote; ties go to the answer seen first), passed when the first sample giving it passed.
- Every figure is a mean over prompts with its standard error over prompts (sample standard
  deviation / sqrt(prompts)); one prompt has no standard error (NaN).
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from ..config import EvalConfig, GenerationConfig, RewardConfig
from ..distributed.world import Collective
from ..errors import one_line
from ..generation import EngineOptions, SamplingParams
from ..generation.backends import make_engine
from ..generation.forward import kv_bytes_per_token
from ..generation.scheduler import StopStrings
from ..grading.final_answer import extract_answer, normalize_number
from ..group import Completion, Example, Group
from ..loops import run_coroutine
from ..monitor.metrics import PROMPT_TEXT_CHARS
from ..rewards import RewardedTask, build_scorer
from ..rewards.service import RewardService
from ..tasks import Task
from ..tasks.arithmetic import line_answer

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
             backend: str = "auto", stop: StopStrings | None = None, kept: Mapping[int, list[Completion]] | None = None,
             keep: Callable[[int, list[Completion]], None] | None = None) -> list[list[Completion]]:
    """`size` completions of every prompt, in prompt order, by `backend` (generation.backend:
    generation/backends.py), each ending at EOS, the length limit or one of the `stop` strings;
    `progress` hears of each finished prompt. Prompts in `kept` (index: completions, from an
    evaluation stopped part-way) are not generated again; `keep` is handed each newly finished one."""
    done: dict[int, list[Completion]] = dict(kept or {})
    todo = [i for i in range(len(prompt_ids)) if i not in done]
    if not todo:
        return [done[i] for i in range(len(prompt_ids))]
    max_len = max(len(p) for p in prompt_ids) + params.max_new_tokens
    fit = KV_BUDGET_BYTES // (max_len * kv_bytes_per_token(model, next(model.parameters()).dtype))
    slots = max(size, min(MAX_SLOTS, size * len(todo), fit))
    # fuse=False: the same model serves a greedy and a sampled engine in turn (generation/forward.py).
    options = EngineOptions(slots, max_len, params, seed=seed, fuse=False, stop=stop,
                            prompt_prefix=tuple(common_prefix(prompt_ids)))
    engine = make_engine(model, eos_ids, options, backend)
    for i in todo:
        engine.submit(Group(i, prompt_ids[i], size, examples[i]))
    while engine.busy:
        finished = engine.step()
        for group in finished:
            done[group.group_id] = group.completions
            if keep is not None:
                keep(group.group_id, group.completions)
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
    service.wait_ready()  # workers still starting are charged to no check

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


# -- the in-run evaluation ------------------------------------------------------------------------
@dataclass
class EvalSet:
    examples: list[Example]
    prompt_ids: list[list[int]]  # tokenised once, reused at every evaluation


@dataclass
class EvalResult:
    pass_rate: float
    mean_length: float
    n: int
    figures: dict[str, float] = field(default_factory=dict)  # with sampling (eval.samples): eval_pass_at_<k>
    rows: list[dict[str, Any]] = field(default_factory=list)  # every completion, for eval_samples.jsonl
    failures: int = 0  # completions whose reward check failed (raised, hung, garbage): scored 0


class KeptCompletions:
    """The last evaluation's completions, held until the run log writes them under their step."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def put(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def take(self) -> list[dict[str, Any]]:
        rows, self.rows = self.rows, []
        return rows


def evaluate(model: PreTrainedModel, eval_set: EvalSet, rewards: RewardService, eos_ids: list[int],
             max_new_tokens: int, samples: int = 0, temperature: float = 1.0, seed: int = 0,
             backend: str = "auto") -> EvalResult:
    """Greedy pass rate of `model` on the held-out set (runs on the model's own device), generated by
    `backend` (generation.backend) and scored by `rewards`; with `samples` > 0 also that many sampled
    completions per prompt, for pass@k."""
    if not eval_set.examples:
        return EvalResult(float("nan"), 0.0, 0)
    was_training = model.training
    # generate() runs the engine with fuse=False: `model` is the trainer's own (or its gathered
    # mirror, which checkpoints export); fusing would make its q/k/v and gate/up parameters share
    # storage, which save_pretrained refuses and FSDP or a later `.to()` would silently undo
    # (generation/forward.py).
    phases = [SamplingParams(greedy=True, max_new_tokens=max_new_tokens)]
    if samples:
        phases.append(SamplingParams(temperature, 1.0, max_new_tokens))
    groups = [group for size, params in zip((1, samples), phases)
              for group in generate(model, eos_ids, eval_set.prompt_ids, eval_set.examples, size, params, seed,
                                    lambda _: None, backend)]
    model.train(was_training)
    if model.device.type == "cuda":
        torch.cuda.empty_cache()
    # Both phases in one call: a reward that hangs costs the evaluation one deadline, not one a phase.
    scored, failures = score(rewards, groups, eval_set.examples * len(phases))
    n = len(eval_set.examples)
    rows = [completion_row(i % n, eval_set.examples[i % n], j, s, greedy=i < n)
            for i, group in enumerate(scored) for j, s in enumerate(group)]
    greedy_rows = rows[:n]
    result = EvalResult(sum(r["reward"] for r in greedy_rows) / n, sum(r["length"] for r in greedy_rows) / n, n,
                        rows=rows, failures=failures)
    if samples:
        result.figures = sampled_metrics(rows[n:], samples)
    return result


def completion_row(i: int, example: Example | None, sample: int, scored: Scored, greedy: bool) -> dict[str, Any]:
    """One row of eval_samples.jsonl (the run log adds the step); the prompt as samples.jsonl keeps it."""
    prompt = example.prompt if example is not None and len(example.prompt) <= PROMPT_TEXT_CHARS else None
    return {"prompt_id": example.uid if example is not None else str(i), "greedy": greedy, "sample": sample,
            "reward": scored.reward, "text": scored.text, "length": scored.length, "truncated": scored.truncated,
            "prompt": prompt}


def sampled_metrics(rows: list[dict[str, Any]], size: int) -> dict[str, float]:
    """eval_pass_at_<k> (k = powers of two up to `size`, and `size`) from the sampled rows, `size`
    per prompt in prompt order; a completion passes at reward 1 (the verifier's full score)."""
    prompts = [rows[i:i + size] for i in range(0, len(rows), size)]
    figures = sampled_figures([PromptVerdicts([r["reward"] for r in p], [r["reward"] >= 1.0 for r in p],
                                              [r["length"] for r in p], [r["truncated"] for r in p]) for p in prompts])
    return {f"eval_pass_at_{name[len('pass@'):]}": v for name, v in figures.items()
            if name.startswith("pass@") and not name.endswith("_se")}


Evaluator = Callable[[], dict[str, float]]


def build_evaluator(e: EvalConfig, generation: GenerationConfig, reward: RewardConfig, seed: int,
                    model: PreTrainedModel, eval_set: EvalSet, task: Task, decode: Callable[[list[int]], str],
                    eos: list[int], keep: KeptCompletions | None = None) -> Evaluator:
    """Held-out greedy pass rate of the trainer's weights (runs on the trainer's thread), and pass@k
    with eval.samples, scored as `eval` scores; `keep` receives the completions for eval_samples.jsonl."""
    max_new_tokens = e.max_new_tokens or generation.max_new_tokens
    rewards = held_out_rewards(reward, task, decode)  # one for the run: its worker processes stay warm

    def run_eval() -> dict[str, float]:
        result = evaluate(model, eval_set, rewards, eos, max_new_tokens, e.samples, e.temperature, seed,
                          backend=generation.backend)
        if keep is not None:
            keep.put(result.rows)
        # eval_reward_failures: reward functions' failures, the figure a run with reward.functions has had
        counted = {"eval_reward_failures": result.failures} if isinstance(task, RewardedTask) else {}
        return {"eval_pass_rate": result.pass_rate, "eval_len_mean": result.mean_length, **result.figures, **counted}
    return run_eval


def shard_eval_set(eval_set: EvalSet, rank: int, size: int) -> EvalSet:
    return EvalSet(eval_set.examples[rank::size], eval_set.prompt_ids[rank::size])


def sharded_evaluator(evaluate_shard: Evaluator, refresh: Callable[[], object], shard_size: int,
                      collective: Collective) -> Evaluator:
    """`evaluate_shard` scores this rank's shard (`shard_size` prompts) on the weights `refresh`
    gathers; both `refresh` and the reduction are collectives, run on the trainer's thread."""
    def run() -> dict[str, float]:
        refresh()
        local = evaluate_shard() if shard_size else {"eval_pass_rate": 0.0, "eval_len_mean": 0.0}
        failed = local.get("eval_reward_failures")  # present when reward functions score (any rank alike)
        sums = torch.tensor([local["eval_pass_rate"] * shard_size, local["eval_len_mean"] * shard_size, shard_size,
                             failed or 0], dtype=torch.float64)
        passed, length, n, failures = collective.sum_(sums).tolist()
        counted = {} if failed is None else {"eval_reward_failures": failures}
        if n == 0:
            return {"eval_pass_rate": math.nan, "eval_len_mean": 0.0, **counted}
        return {"eval_pass_rate": passed / n, "eval_len_mean": length / n, **counted}
    return run


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that k of n samples (c of them passing), drawn without replacement, hold a pass."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)
        miss *= 1.0 - k / i
    return 1.0 - miss


def ks_up_to(n: int) -> list[int]:
    """The k reported for n samples: the powers of two below n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n] if n >= 1 else []


def majority(answers: Sequence[str | None]) -> str | None:
    """The most frequent answer (None never votes); ties go to the one that appeared first."""
    counts: dict[str, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1  # dicts keep first-appearance order: max keeps the first
    return max(counts, key=counts.__getitem__) if counts else None


def maj_at_k(answers: Sequence[str | None], passed: Sequence[bool], k: int) -> bool:
    """Whether the majority answer of the first k samples passed (no answer at all: it did not)."""
    winner = majority(answers[:k])
    if winner is None:
        return False
    return passed[list(answers[:k]).index(winner)]


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (NaN for what is undefined: no values, or one)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


@dataclass
class PromptVerdicts:
    """One prompt's completions as the figures need them, in sample order."""

    rewards: list[float]
    passed: list[bool]
    lengths: list[int]
    truncated: list[bool]
    answers: list[str | None] = field(default_factory=list)  # empty: the task defines no answer


def completion_figures(prompts: Sequence[PromptVerdicts], suffix: str = "") -> dict[str, float]:
    """pass@1, mean reward, mean length and the fraction cut off by the length limit, each a mean
    over prompts of the prompt's mean, with its standard error (`<name>_se`)."""
    out: dict[str, float] = {}
    for name, values in (("pass@1", [p.passed for p in prompts]), ("reward_mean", [p.rewards for p in prompts]),
                         ("length_mean", [p.lengths for p in prompts]),
                         ("truncated", [p.truncated for p in prompts])):
        _put(out, name + suffix, [sum(map(float, v)) / len(v) for v in values if v])
    return out


def sampled_figures(prompts: Sequence[PromptVerdicts], ks: Sequence[int] | None = None) -> dict[str, float]:
    """pass@k and (where answers exist) maj@k for each k of `ks` (default `ks_up_to(n)`), n the
    samples per prompt; a k above n raises (pass@k's estimator is undefined there)."""
    n = min((len(p.passed) for p in prompts), default=0)
    out: dict[str, float] = {}
    with_answers = bool(prompts) and all(len(p.answers) == len(p.passed) for p in prompts)
    for k in ks_up_to(n) if ks is None else ks:
        _put(out, f"pass@{k}", [pass_at_k(n, sum(p.passed[:n]), k) for p in prompts])
        if with_answers:
            _put(out, f"maj@{k}", [float(maj_at_k(p.answers, p.passed, k)) for p in prompts])
    return out


def _put(out: dict[str, float], name: str, values: list[float]) -> None:
    out[name], out[name + "_se"] = mean_se(values)


# The final answer a completion commits to, for majority voting (maj@k), where the task defines one:
# the raw arithmetic format's whole completion, and the answer the GSM8K reader finds (the arithmetic
# chat style is graded by that reader too), as a canonical number where it is one ("1,000" = "1000").
# Other tasks (files, hub sets, reward functions alone) define no answer: no maj@k.
Reader = Callable[[str], "str | None"]


def answer_reader(task: Task) -> Reader | None:
    """How to read a completion's final answer for `task`, or None when the task defines none."""
    base = getattr(task, "task", task)  # reward functions wrap the task (rewards.reward_functions.RewardedTask)
    if base.name == "arithmetic" and getattr(base, "style", "raw") == "raw":
        return raw_answer
    if base.name == "arithmetic" and base.style == "question":
        return line_answer
    if base.name in ("arithmetic", "gsm8k"):
        return read_answer
    return None


def raw_answer(text: str) -> str | None:
    """The raw format's answer is the whole completion (the verifier's exact match)."""
    return text.strip() or None


def read_answer(text: str) -> str | None:
    """The GSM8K reader's final answer, canonical when it is a number."""
    found = extract_answer(text)
    if found is None:
        return None
    return normalize_number(found) or found.strip()
