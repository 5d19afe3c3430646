"""Tasks: prompt sources and verifiers (synthetic arithmetic, GSM8K, users' own files and hub sets).

`base_task` makes the task `data.task` names; `rewards.build_task` wraps it when `reward.functions`
are configured, so those functions score training and evaluation alike.
"""
from __future__ import annotations

from ..config import ArithmeticConfig, DataConfig
from ..errors import ConfigError
from ..group import Example
from .arithmetic import ArithmeticTask
from .base import PromptRenderer, Task

BUILTIN = ("arithmetic", "gsm8k", "file", "hub")


def base_task(d: DataConfig, a: ArithmeticConfig, timeout_s: float, rewarded: bool) -> Task:
    if d.task in ("file", "hub"):
        return _custom_task(d, timeout_s, rewarded)
    if d.task == "arithmetic":
        return ArithmeticTask(a.digits, a.ops, d.eval_size, d.shuffle_seed, style=a.style, max_operand=a.max_operand)
    if d.task == "gsm8k":
        from .gsm8k import GSM8KTask

        return GSM8KTask(path=d.path, hub_name=d.hub_name or "openai/gsm8k", hub_config=d.hub_config or "main",
                         split=d.split, eval_split=d.eval_split if d.path is None else None,
                         eval_path=d.eval_path, eval_size=d.eval_size, skip_bad_rows=d.skip_bad_rows,
                         seed=d.shuffle_seed, question_field=d.prompt_field, answer_field=d.answer_field,
                         timeout_s=timeout_s)
    raise ConfigError("data.task", f"unknown task '{d.task}' (built in: {', '.join(BUILTIN)})")


def _custom_task(d: DataConfig, timeout_s: float, rewarded: bool) -> Task:
    """A file or hub task; `rewarded`: reward.functions score it (the rows need no answer then)."""
    from .custom import CustomTask
    from .rows import RowSource

    if d.task == "file":
        if d.path is None:
            raise ConfigError("data.path", "data.task=file reads its rows from data.path (.jsonl/.json/.csv/.parquet)")
        if d.eval_split is not None:
            raise ConfigError("data.eval_split", "applies to data.task=hub; for a file task set data.eval_path")
    elif d.hub_name is None:
        raise ConfigError("data.hub_name", "data.task=hub needs a datasets hub name (and data.hub_config, data.split)")
    elif d.path is not None:
        raise ConfigError("data.path", "is set but data.task=hub; use data.task=file to read a local file")
    source = RowSource(path=d.path if d.task == "file" else None, hub_name=d.hub_name, hub_config=d.hub_config,
                       split=d.split, eval_split=d.eval_split, eval_path=d.eval_path, eval_size=d.eval_size,
                       seed=d.shuffle_seed, skip_bad_rows=d.skip_bad_rows,
                       fields=(d.prompt_field,) if rewarded else (d.prompt_field, d.answer_field))
    return CustomTask(source, name=d.task, prompt_field=d.prompt_field, answer_field=d.answer_field,
                      answer_required=not rewarded, chat=d.prompt_template is None, timeout_s=timeout_s)


__all__ = ["ArithmeticTask", "Example", "PromptRenderer", "Task", "base_task"]
