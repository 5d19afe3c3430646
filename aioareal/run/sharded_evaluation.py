"""Held-out evaluation on several ranks: each rank scores every N-th held-out prompt on the full
weights (gathered into its `Mirror`), and the sums are all-reduced, so every rank reports the pass
rate of the whole held-out set, as one process would."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..distributed.reduce import Collective
from .evaluation import EvalSet

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
