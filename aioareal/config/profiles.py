"""Defaults that fit the model: the dataclass defaults are the offline tiny model's (8 new tokens,
lr 1e-4, 400 steps); a pretrained model given without a --config file gets the `pretrained` profile
instead, beneath anything the user wrote (defaults < profile < flags < key=value). A config file
states a run: the keys it leaves out keep the dataclass defaults, as they always did.

A model is pretrained unless it is `tiny` or a `random:<shape>` (random weights, for benchmarks).
The profile's values come from configs/qwen2.5-0.5b-gsm8k.yaml (long answers, lr 1e-6: a rate of
1e-4 wrecks a pretrained model in a few steps) and configs/smollm2-sums.yaml (short chat sums).
`python -m aioareal config --sources` shows which values a run took from it.
"""
from __future__ import annotations

from typing import Any

PRETRAINED = "pretrained"

_COMMON: dict[str, Any] = {
    "algo.lr": 1e-6, "algo.warmup_steps": 5, "algo.clip_eps_high": 0.28, "algo.loss_agg": "token-mean",
    "algo.group_size": 8, "algo.batch_groups": 32,
    "generation.temperature": 1.0, "train.steps": 200, "eval.every": 20, "run.checkpoint_every": 20,
    "reward.timeout_s": 10.0,
}
# The task decides how long an answer runs: reasoning in words, or a chat-format sum.
_BY_TASK: dict[str, dict[str, Any]] = {
    "arithmetic": {"generation.max_new_tokens": 64, "arithmetic.style": "chat", "algo.lr": 1e-5},
}
_LONG_ANSWERS: dict[str, Any] = {"generation.max_new_tokens": 512}


def is_pretrained(model_name: str) -> bool:
    return model_name != "tiny" and not model_name.startswith("random:")


def profile_for(model_name: str, task: str) -> tuple[str | None, dict[str, Any]]:
    """(profile name, {dotted key: value}) for a model and task; (None, {}) for the tiny model."""
    if not is_pretrained(model_name):
        return None, {}
    return PRETRAINED, {**_COMMON, **_BY_TASK.get(task, _LONG_ANSWERS)}
