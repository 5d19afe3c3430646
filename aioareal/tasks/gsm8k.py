"""GSM8K: grade-school math word problems, scored by final-answer equivalence.

`gsm8k_reward` is the public grader, with TRL's reward-function signature
(`GRPOTrainer(reward_funcs=[gsm8k_reward])`); the task scores with the same grader. The prompt is the
question plus the common instruction to box the answer (docs/architecture.md#reference-facts); the
reference is the whole gold solution, whose `#### N` line the verifier extracts.
"""
from __future__ import annotations

from typing import Any

from ..grading.verify import Deferred, grade, grade_now
from ..group import Example
from .rows import RowSource, RowTask, field_value

INSTRUCTION = "Please put your final answer within \\boxed{}."


def gsm8k_reward(completions: list[Any], answer: list[str], timeout_s: float = 5.0, **kwargs: Any) -> list[float]:
    """1.0 for each completion whose final answer equals the reference, else 0.0 (TRL's signature).

    `answer`: the GSM8K solutions (`... #### 18`) or bare answers, one per completion. `completions`:
    strings, or TRL's conversational form (the last message is graded). Formulas go to math-verify in
    a worker process, stopped after `timeout_s` (a failure scores 0 and counts in `verify_failures()`).
    """
    return grade_now([str(a) for a in answer], [_text(c) for c in completions], timeout_s)


def _text(completion: Any) -> str:
    if isinstance(completion, list):  # [{"role": "assistant", "content": "..."}]
        return str(completion[-1].get("content", "")) if completion else ""
    return str(completion)


class GSM8KTask(RowTask):
    name = "gsm8k"
    chat = True

    def __init__(self, path: str | None = None, hub_name: str = "openai/gsm8k", hub_config: str = "main",
                 split: str = "train", eval_split: str | None = "test", eval_path: str | None = None,
                 eval_size: int = 200, skip_bad_rows: bool = False, seed: int = 1234,
                 question_field: str = "question", answer_field: str = "answer", timeout_s: float = 5.0) -> None:
        self.source = RowSource(path=path, hub_name=hub_name, hub_config=hub_config, split=split,
                                eval_split=eval_split, eval_path=eval_path, eval_size=eval_size, seed=seed,
                                skip_bad_rows=skip_bad_rows, fields=(question_field, answer_field))
        self.question_field, self.answer_field, self.timeout_s = question_field, answer_field, timeout_s

    def score(self, completion: str, example: Example) -> float:
        return gsm8k_reward([completion], [example.answer], self.timeout_s)[0]

    def grade(self, completion: str, example: Example) -> float | Deferred:
        """The reward service's form: decided here, or a Deferred check for its worker pool."""
        return grade(example.answer, completion)

    def _example(self, row: dict[str, Any], where: str, split: str, index: int) -> Example | None:
        skip = self.source.skip_bad_rows
        question = field_value(row, self.question_field, where, skip)
        answer = field_value(row, self.answer_field, where, skip) if question is not None else None
        if question is None or answer is None:
            return None
        return Example(uid=f"gsm8k-{split}-{index}", prompt=f"{str(question).strip()}\n{INSTRUCTION}",
                       answer=str(answer).strip(), row=row)
