"""Users' own tasks: rows from a local file (`data.task=file`) or a hub dataset (`data.task=hub`).

A row becomes an example by two field names: the prompt is `row[data.prompt_field]` (the user
message of the chat template, or the text a raw `data.prompt_template` formats), the reference
answer is `row[data.answer_field]`, and every column stays on the example for reward functions.
The answer may be absent when reward functions are configured: they decide what is right.

The default verifier (no reward functions): a numeric answer is compared with the completion's
final answer as a number (`verify.grade`, the GSM8K grader: "46", "the answer is 46.0" and
"\\boxed{46}" all pass); any other answer must equal the whole completion up to surrounding and
repeated whitespace.
"""
from __future__ import annotations

from typing import Any

from ..errors import DataError
from .answers import normalize_number
from .base import Example
from .rows import RowSource, RowTask, field_value
from .verify import Deferred, grade, math_equal


class CustomTask(RowTask):
    def __init__(self, source: RowSource, name: str = "file", prompt_field: str = "question",
                 answer_field: str = "answer", answer_required: bool = True, chat: bool = True,
                 timeout_s: float = 5.0) -> None:
        self.source, self.name, self.chat, self.timeout_s = source, name, chat, timeout_s
        self.prompt_field, self.answer_field, self.answer_required = prompt_field, answer_field, answer_required

    def score(self, completion: str, example: Example) -> float:
        if normalize_number(example.answer) is not None:
            return math_equal(example.answer, completion, self.timeout_s)
        return float(_squash(completion) == _squash(example.answer))

    def grade(self, completion: str, example: Example) -> float | Deferred:
        """The reward service's form of `score`: symbolic checks come back as a Deferred for its workers."""
        if normalize_number(example.answer) is not None:
            return grade(example.answer, completion)
        return self.score(completion, example)

    def _example(self, row: dict[str, Any], where: str, split: str, index: int) -> Example | None:
        skip = self.source.skip_bad_rows
        prompt = field_value(row, self.prompt_field, where, skip, hint="; set data.prompt_field")
        if prompt is None:
            return None
        if not isinstance(prompt, str):
            raise DataError(f"{where}: field '{self.prompt_field}' is a {type(prompt).__name__}, expected the "
                            f"prompt text (a string); data.system_prompt sets a system message")
        if self.answer_required:
            hint = "; set data.answer_field, or reward.functions to score without reference answers"
            answer = field_value(row, self.answer_field, where, skip, hint=hint)
            if answer is None:
                return None
        else:
            answer = row.get(self.answer_field)
        return Example(uid=f"{self.name}-{split}-{index}", prompt=prompt,
                       answer="" if answer is None else str(answer).strip(), row=row)


def _squash(text: str) -> str:
    return " ".join(text.split())
