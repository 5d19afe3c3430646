"""Rewards: what a completion is worth. `reward_functions` loads users' reward functions and weighs
them (in the service's threads, or in worker processes with `reward.isolation=process`); `service`
scores each finished group off the event loop under one deadline and counts every failure.

`build_task` is the task `data.task` names, wrapped when `reward.functions` are configured so those
functions score training and evaluation alike; `build_scorer` gives the reward service the batch form
of that score: a task's `grade` when it has one (its symbolic checks then run in the service's worker
processes), else its `score`; with `reward.isolation=process` the reward functions themselves run in
those workers.
"""
from __future__ import annotations

from ..config import ArithmeticConfig, DataConfig, RewardConfig
from ..isolation.threads import GuardedCaller
from ..tasks import Task, base_task
from .reward_functions import ProcessRewards, RewardedTask, WeightedRewards, load_reward_functions
from .service import BatchScorer, GradedScorer, per_item


def build_task(data: DataConfig, arithmetic: ArithmeticConfig, reward: RewardConfig, group_size: int) -> Task:
    """The task data.task names; `group_size` (algo.group_size) shares reward.timeout_s among a group's
    completions for the checks outside the reward service (`_item_timeout`)."""
    task = base_task(data, arithmetic, _item_timeout(reward, group_size), bool(reward.functions))
    if not reward.functions:
        return task
    r = reward
    rewards = WeightedRewards(load_reward_functions(r.functions), r.weights)
    # The check before training and evaluation call the functions under training's timeout and isolation.
    return RewardedTask(task, rewards, GuardedCaller(r.timeout_s, r.workers, r.memory_limit_mb), r.isolation)


def build_scorer(reward: RewardConfig, task: Task, tally: bool = True) -> BatchScorer:
    """The reward service's scorer: the configured reward functions in batch form, else the task's verdict.
    `tally`: the functions' values go into the metrics' reward/<name> figures (training's, not held-out's)."""
    r = reward
    if r.functions and r.isolation == "process":
        return ProcessRewards(r.functions, r.weights)
    if isinstance(task, RewardedTask):
        return task.rewards if tally else WeightedRewards(task.rewards.functions, task.rewards.weights, tally=False)
    if r.functions:  # a task built by hand rather than by build_task
        return WeightedRewards(load_reward_functions(r.functions), r.weights, tally)
    grade = getattr(task, "grade", None)
    if grade is not None:
        from ..grading.verify import SYMBOLIC_MODULE

        return GradedScorer(grade, (SYMBOLIC_MODULE,))
    return per_item(task.score)


def _item_timeout(reward: RewardConfig, group_size: int) -> float:
    """The standalone checks' timeout (`task.score`, which episodes' evaluation calls outside the
    reward service): a share of reward.timeout_s per completion, at least a second unless the whole timeout
    is shorter. Training rewards need none: the service's deadline covers the whole group."""
    share = reward.timeout_s / group_size
    return min(reward.timeout_s, max(share, 1.0))
