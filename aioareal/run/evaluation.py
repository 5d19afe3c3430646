"""Held-out evaluation: greedy decoding of every held-out prompt, scored by the task's verifier."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

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
