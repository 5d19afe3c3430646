"""Held-out evaluation: greedy decoding of every held-out prompt, scored by the task's verifier (and
with eval.samples, that many sampled completions a prompt: pass@k in the metrics).

On several ranks each rank scores every N-th held-out prompt on the full weights (gathered into its
`Mirror`), and the sums are all-reduced, so every rank reports the pass rate of the whole held-out
set, as one process would (`shard_eval_set`, `sharded_evaluator`)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from ..distributed.reduce import Collective
from ..evaluate.metrics import PromptVerdicts, sampled_figures
from ..evaluate.rollout import generate
from ..generation import SamplingParams
from ..orchestrator.report import PROMPT_TEXT_CHARS
from ..samples import Completion
from ..tasks.base import Example


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


class KeptCompletions:
    """The last evaluation's completions, held until the run log writes them under their step."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def put(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def take(self) -> list[dict[str, Any]]:
        rows, self.rows = self.rows, []
        return rows


def evaluate(model: PreTrainedModel, eval_set: EvalSet, score: Callable[[str, Example], float],
             decode: Callable[[list[int]], str], eos_ids: list[int], max_new_tokens: int,
             samples: int = 0, temperature: float = 1.0, seed: int = 0) -> EvalResult:
    """Greedy pass rate of `model` on the held-out set (runs on the model's own device); with
    `samples` > 0 also that many sampled completions per prompt, for pass@k."""
    if not eval_set.examples:
        return EvalResult(float("nan"), 0.0, 0)
    was_training = model.training
    # generate() runs the engine with fuse=False: `model` is the trainer's own (or its gathered
    # mirror, which checkpoints export); fusing would make its q/k/v and gate/up parameters share
    # storage, which save_pretrained refuses and FSDP or a later `.to()` would silently undo
    # (generation/fusion.py).
    phases = [(True, 1, SamplingParams(greedy=True, max_new_tokens=max_new_tokens))]
    if samples:
        phases.append((False, samples, SamplingParams(temperature, 1.0, max_new_tokens)))
    done = [(greedy, generate(model, eos_ids, eval_set.prompt_ids, eval_set.examples, size, params, seed,
                              lambda _: None)) for greedy, size, params in phases]
    model.train(was_training)
    if model.device.type == "cuda":
        torch.cuda.empty_cache()
    rows = [completion_row(i, example, j, completion, decode(completion.tokens), score, greedy)
            for greedy, groups in done for i, (example, group) in enumerate(zip(eval_set.examples, groups))
            for j, completion in enumerate(group)]
    greedy_rows = rows[:len(eval_set.examples)]
    result = EvalResult(sum(r["reward"] for r in greedy_rows) / len(greedy_rows),
                        sum(r["length"] for r in greedy_rows) / len(greedy_rows), len(greedy_rows), rows=rows)
    if samples:
        result.figures = sampled_metrics(rows[len(greedy_rows):], samples)
    return result


def completion_row(i: int, example: Example | None, sample: int, completion: Completion, text: str,
                   score: Callable[[str, Example], float], greedy: bool) -> dict[str, Any]:
    """One row of eval_samples.jsonl (the run log adds the step); the prompt as samples.jsonl keeps it."""
    prompt = example.prompt if example is not None and len(example.prompt) <= PROMPT_TEXT_CHARS else None
    return {"prompt_id": example.uid if example is not None else str(i), "greedy": greedy, "sample": sample,
            "reward": score(text, example), "text": text, "length": len(completion.tokens),
            "truncated": completion.finish_reason == "length", "prompt": prompt}


def sampled_metrics(rows: list[dict[str, Any]], size: int) -> dict[str, float]:
    """eval_pass_at_<k> (k = powers of two up to `size`, and `size`) from the sampled rows, `size`
    per prompt in prompt order; a completion passes at reward 1 (the verifier's full score)."""
    prompts = [rows[i:i + size] for i in range(0, len(rows), size)]
    figures = sampled_figures([PromptVerdicts([r["reward"] for r in p], [r["reward"] >= 1.0 for r in p],
                                              [r["length"] for r in p], [r["truncated"] for r in p]) for p in prompts])
    return {f"eval_pass_at_{name[len('pass@'):]}": v for name, v in figures.items()
            if name.startswith("pass@") and not name.endswith("_se")}


Evaluator = Callable[[], dict[str, float]]


def shard_eval_set(eval_set: EvalSet, rank: int, size: int) -> EvalSet:
    return EvalSet(eval_set.examples[rank::size], eval_set.prompt_ids[rank::size])


def sharded_evaluator(evaluate_shard: Evaluator, refresh: Callable[[], object], shard_size: int,
                      collective: Collective) -> Evaluator:
    """`evaluate_shard` scores this rank's shard (`shard_size` prompts) on the weights `refresh`
    gathers; both `refresh` and the reduction are collectives, run on the trainer's thread."""
    def run() -> dict[str, float]:
        refresh()
        local = evaluate_shard() if shard_size else {"eval_pass_rate": 0.0, "eval_len_mean": 0.0}
        sums = torch.tensor([local["eval_pass_rate"] * shard_size, local["eval_len_mean"] * shard_size, shard_size],
                            dtype=torch.float64)
        passed, length, n = collective.sum_(sums).tolist()
        if n == 0:
            return {"eval_pass_rate": math.nan, "eval_len_mean": 0.0}
        return {"eval_pass_rate": passed / n, "eval_len_mean": length / n}
    return run
