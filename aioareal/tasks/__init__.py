"""Tasks: prompt sources and verifiers (synthetic arithmetic, GSM8K, users' own)."""
from __future__ import annotations

from ..config import Config
from ..errors import ConfigError
from .arithmetic import ArithmeticTask
from .base import Example, PromptRenderer, Task

BUILTIN = ("arithmetic", "gsm8k")


def build_task(config: Config) -> Task:
    d = config.data
    if d.task == "arithmetic":
        return ArithmeticTask(d.arith_digits, d.arith_ops, d.eval_size, d.shuffle_seed)
    if d.task == "gsm8k":
        from .gsm8k import GSM8KTask

        return GSM8KTask(path=d.path, hub_name=d.hub_name or "openai/gsm8k", hub_config=d.hub_config or "main",
                         split=d.split, eval_split=d.eval_split if d.path is None else None,
                         eval_path=d.eval_path, eval_size=d.eval_size, skip_bad_rows=d.skip_bad_rows,
                         seed=d.shuffle_seed, question_field=d.prompt_field, answer_field=d.answer_field,
                         timeout_s=config.reward.timeout_s)
    raise ConfigError("data.task", f"unknown task '{d.task}' (built in: {', '.join(BUILTIN)})")


__all__ = ["ArithmeticTask", "Example", "PromptRenderer", "Task", "build_task"]
