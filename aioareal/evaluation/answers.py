"""The final answer a completion commits to, for majority voting (maj@k), where the task defines one:
the raw arithmetic format's whole completion, and the answer the GSM8K reader finds (the arithmetic
chat style is graded by that reader too), as a canonical number where it is one ("1,000" = "1000").
Other tasks (files, hub sets, reward functions alone) define no answer: no maj@k."""
from __future__ import annotations

from collections.abc import Callable

from ..grading.final_answer import extract_answer, normalize_number
from ..tasks.arithmetic import line_answer
from ..tasks.base import Task

Reader = Callable[[str], "str | None"]


def answer_reader(task: Task) -> Reader | None:
    """How to read a completion's final answer for `task`, or None when the task defines none."""
    base = getattr(task, "task", task)  # reward functions wrap the task (tasks.reward_functions.RewardedTask)
    if base.name == "arithmetic" and getattr(base, "style", "raw") == "raw":
        return raw_answer
    if base.name == "arithmetic" and base.style == "question":
        return line_answer
    if base.name in ("arithmetic", "gsm8k"):
        return read_answer
    return None


def raw_answer(text: str) -> str | None:
    """The raw format's answer is the whole completion (the verifier's exact match)."""
    return text.strip() or None


def read_answer(text: str) -> str | None:
    """The GSM8K reader's final answer, canonical when it is a number."""
    found = extract_answer(text)
    if found is None:
        return None
    return normalize_number(found) or found.strip()
