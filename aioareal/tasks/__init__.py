"""Tasks: prompt sources and verifiers (synthetic arithmetic, GSM8K, users' own files and hub sets).

`base_task` (base.py) makes the task `data.task` names; `rewards.build_task` wraps it when `reward.functions`
are configured, so those functions score training and evaluation alike.
"""
from ..group import Example
from .arithmetic import ArithmeticTask
from .base import BUILTIN, PromptRenderer, Task, base_task

__all__ = ["BUILTIN", "ArithmeticTask", "Example", "PromptRenderer", "Task", "base_task"]
