"""Rewards: what a completion is worth. `reward_functions` loads users' reward functions and weighs
them (in the service's threads, or in worker processes with `reward.isolation=process`); `service`
scores each finished group off the event loop under one deadline and counts every failure.

`build_task` (reward_functions.py) is the task `data.task` names, wrapped when `reward.functions` are
configured so those functions score training and evaluation alike; `build_scorer` gives the reward
service the batch form of that score: a task's `grade` when it has one (its symbolic checks then run
in the service's worker processes), else its `score`; with `reward.isolation=process` the reward
functions themselves run in those workers.
"""
from .reward_functions import (
    ProcessRewards,
    RewardedTask,
    WeightedRewards,
    build_scorer,
    build_task,
    load_reward_functions,
)
from .service import BatchScorer, GradedScorer, per_item

__all__ = ["BatchScorer", "GradedScorer", "ProcessRewards", "RewardedTask", "WeightedRewards", "build_scorer",
           "build_task", "load_reward_functions", "per_item"]
