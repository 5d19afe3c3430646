"""Tasks: prompt sources and verifiers (synthetic arithmetic, GSM8K, users' own files and hub sets).

Every task, built-in or not, goes through one path: `build_task` makes it from its config sections
(data, arithmetic, reward) and, when `reward.functions` are configured, wraps it so those functions
score training and evaluation alike; `build_scorer` gives the reward service the batch form of that
score (`scoring`): a task's `grade` when it has one (its symbolic checks then run in the service's
worker processes), else its `score`; with `reward.isolation=process` the reward functions themselves
run in those workers.
"""
from __future__ import annotations

from ..config import ArithmeticConfig, DataConfig, RewardConfig
from ..errors import ConfigError
from ..group import Example
from ..isolation.threads import GuardedCaller
from .arithmetic import ArithmeticTask
from .base import PromptRenderer, Task
from .reward_functions import RewardedTask, WeightedRewards, load_reward_functions
from .scoring import BatchScorer, GradedScorer, per_item

BUILTIN = ("arithmetic", "gsm8k", "file", "hub")


def build_task(data: DataConfig, arithmetic: ArithmeticConfig, reward: RewardConfig, group_size: int) -> Task:
    """The task data.task names; `group_size` (algo.group_size) shares reward.timeout_s among a group's
    completions for the checks outside the reward service (`_item_timeout`)."""
    task = _base_task(data, arithmetic, _item_timeout(reward, group_size), bool(reward.functions))
    if not reward.functions:
        return task
    r = reward
    rewards = WeightedRewards(load_reward_functions(r.functions), r.weights)
    # The check before training and evaluation call the functions under training's timeout and isolation.
    return RewardedTask(task, rewards, GuardedCaller(r.timeout_s, r.workers, r.memory_limit_mb), r.isolation)


def build_scorer(reward: RewardConfig, task: Task) -> BatchScorer:
    """The reward service's scorer: the configured reward functions in batch form, else the task's verdict."""
    r = reward
    if r.functions and r.isolation == "process":
        from .isolated import ProcessRewards

        return ProcessRewards(r.functions, r.weights)
    if isinstance(task, RewardedTask):
        return task.rewards
    if r.functions:  # a task built by hand rather than by build_task
        return WeightedRewards(load_reward_functions(r.functions), r.weights)
    grade = getattr(task, "grade", None)
    if grade is not None:
        from ..grading.verify import SYMBOLIC_MODULE

        return GradedScorer(grade, (SYMBOLIC_MODULE,))
    return per_item(task.score)


def _base_task(d: DataConfig, a: ArithmeticConfig, timeout_s: float, rewarded: bool) -> Task:
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


def _item_timeout(reward: RewardConfig, group_size: int) -> float:
    """The standalone checks' timeout (`task.score`, which evaluation calls outside the reward
    service): a share of reward.timeout_s per completion, at least a second unless the whole timeout
    is shorter. Training rewards need none: the service's deadline covers the whole group."""
    share = reward.timeout_s / group_size
    return min(reward.timeout_s, max(share, 1.0))


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


__all__ = ["ArithmeticTask", "Example", "PromptRenderer", "Task", "build_scorer", "build_task"]
