"""The figures of an evaluation, from per-prompt verdicts: pure functions, no model, no files.

- pass@k: the unbiased estimator of Chen et al. 2021 (Codex, eq. 1): with n samples of a prompt of
  which c pass, the chance that k drawn without replacement hold at least one pass,
  1 - C(n-c, k) / C(n, k), computed as a product to stay exact for large n.
- maj@k: the majority answer among a prompt's first k samples (samples without an answer do not
  vote; ties go to the answer seen first), passed when the first sample giving it passed.
- Every figure is a mean over prompts with its standard error over prompts (sample standard
  deviation / sqrt(prompts)); one prompt has no standard error (NaN).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..grading.final_answer import extract_answer, normalize_number
from ..tasks.arithmetic import line_answer
from ..tasks.base import Task


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that k of n samples (c of them passing), drawn without replacement, hold a pass."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)
        miss *= 1.0 - k / i
    return 1.0 - miss


def ks_up_to(n: int) -> list[int]:
    """The k reported for n samples: the powers of two below n, and n itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n] if n >= 1 else []


def majority(answers: Sequence[str | None]) -> str | None:
    """The most frequent answer (None never votes); ties go to the one that appeared first."""
    counts: dict[str, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1  # dicts keep first-appearance order: max keeps the first
    return max(counts, key=counts.__getitem__) if counts else None


def maj_at_k(answers: Sequence[str | None], passed: Sequence[bool], k: int) -> bool:
    """Whether the majority answer of the first k samples passed (no answer at all: it did not)."""
    winner = majority(answers[:k])
    if winner is None:
        return False
    return passed[list(answers[:k]).index(winner)]


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (NaN for what is undefined: no values, or one)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


@dataclass
class PromptVerdicts:
    """One prompt's completions as the figures need them, in sample order."""

    rewards: list[float]
    passed: list[bool]
    lengths: list[int]
    truncated: list[bool]
    answers: list[str | None] = field(default_factory=list)  # empty: the task defines no answer


def completion_figures(prompts: Sequence[PromptVerdicts], suffix: str = "") -> dict[str, float]:
    """pass@1, mean reward, mean length and the fraction cut off by the length limit, each a mean
    over prompts of the prompt's mean, with its standard error (`<name>_se`)."""
    out: dict[str, float] = {}
    for name, values in (("pass@1", [p.passed for p in prompts]), ("reward_mean", [p.rewards for p in prompts]),
                         ("length_mean", [p.lengths for p in prompts]),
                         ("truncated", [p.truncated for p in prompts])):
        _put(out, name + suffix, [sum(map(float, v)) / len(v) for v in values if v])
    return out


def sampled_figures(prompts: Sequence[PromptVerdicts], ks: Sequence[int] | None = None) -> dict[str, float]:
    """pass@k and (where answers exist) maj@k for each k of `ks` (default `ks_up_to(n)`), n the
    samples per prompt; a k above n raises (pass@k's estimator is undefined there)."""
    n = min((len(p.passed) for p in prompts), default=0)
    out: dict[str, float] = {}
    with_answers = bool(prompts) and all(len(p.answers) == len(p.passed) for p in prompts)
    for k in ks_up_to(n) if ks is None else ks:
        _put(out, f"pass@{k}", [pass_at_k(n, sum(p.passed[:n]), k) for p in prompts])
        if with_answers:
            _put(out, f"maj@{k}", [float(maj_at_k(p.answers, p.passed, k)) for p in prompts])
    return out


def _put(out: dict[str, float], name: str, values: list[float]) -> None:
    out[name], out[name + "_se"] = mean_se(values)


# The final answer a completion commits to, for majority voting (maj@k), where the task defines one:
# the raw arithmetic format's whole completion, and the answer the GSM8K reader finds (the arithmetic
# chat style is graded by that reader too), as a canonical number where it is one ("1,000" = "1000").
# Other tasks (files, hub sets, reward functions alone) define no answer: no maj@k.
Reader = Callable[[str], "str | None"]


def answer_reader(task: Task) -> Reader | None:
    """How to read a completion's final answer for `task`, or None when the task defines none."""
    base = getattr(task, "task", task)  # reward functions wrap the task (rewards.reward_functions.RewardedTask)
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
