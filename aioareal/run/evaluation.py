"""Held-out evaluation: greedy decoding of every held-out prompt, scored by the task's verifier.

On several ranks each rank scores every N-th held-out prompt on the full weights (gathered into its
`Mirror`), and the sums are all-reduced, so every rank reports the pass rate of the whole held-out
set, as one process would (`shard_eval_set`, `sharded_evaluator`)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..distributed.reduce import Collective
from ..generation import Engine, SamplingParams
from ..samples import Group
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


def evaluate(model: PreTrainedModel, eval_set: EvalSet, score: Callable[[str, Example], float],
             decode: Callable[[list[int]], str], eos_ids: list[int], max_new_tokens: int,
             max_slots: int = 256) -> EvalResult:
    """Greedy pass rate of `model` on the held-out set (runs on the model's own device)."""
    if not eval_set.examples:
        return EvalResult(float("nan"), 0.0, 0)
    was_training = model.training
    max_len = max(len(p) for p in eval_set.prompt_ids) + max_new_tokens
    # fuse=False: `model` is the trainer's own (or its gathered mirror, which checkpoints export);
    # fusing would make its q/k/v and gate/up parameters share storage, which save_pretrained
    # refuses and FSDP or a later `.to()` would silently undo (generation/fusion.py).
    engine = Engine(model, eos_ids, num_slots=min(max_slots, len(eval_set.examples)), max_len=max_len,
                    params=SamplingParams(greedy=True, max_new_tokens=max_new_tokens), fuse=False)
    for i, (ids, example) in enumerate(zip(eval_set.prompt_ids, eval_set.examples)):
        engine.submit(Group(i, ids, 1, example))
    completions: dict[int, list[int]] = {}
    while engine.busy:
        for group in engine.step():
            completions[group.group_id] = group.samples[0].tokens
    del engine
    model.train(was_training)
    if model.device.type == "cuda":
        torch.cuda.empty_cache()
    scores = [score(decode(completions[i]), ex) for i, ex in enumerate(eval_set.examples)]
    lengths = [len(completions[i]) for i in range(len(eval_set.examples))]
    return EvalResult(sum(scores) / len(scores), sum(lengths) / len(lengths), len(scores))


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
        failed = local.get("eval_reward_failures")  # present when reward functions score (any rank alike)
        sums = torch.tensor([local["eval_pass_rate"] * shard_size, local["eval_len_mean"] * shard_size, shard_size,
                             failed or 0], dtype=torch.float64)
        passed, length, n, failures = collective.sum_(sums).tolist()
        counted = {} if failed is None else {"eval_reward_failures": failures}
        if n == 0:
            return {"eval_pass_rate": math.nan, "eval_len_mean": 0.0, **counted}
        return {"eval_pass_rate": passed / n, "eval_len_mean": length / n, **counted}
    return run
