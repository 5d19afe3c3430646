"""Users' own tasks: rows from a local file (`data.task=file`) or a hub dataset (`data.task=hub`).

The prompt is `row[data.prompt_field]`, the reference `row[data.answer_field]` (optional with reward
functions), and every column stays on the example for reward functions. The default verifier compares
a numeric answer with the completion's final answer as a number (the GSM8K grader); any other answer
must equal the whole completion up to whitespace.
"""
from __future__ import annotations

import functools
from typing import Any

from ..errors import DataError
from ..grading.verify import Deferred, grade, math_equal, reference_number
from ..group import Example
from .rows import RowSource, RowTask, field_value

DEFAULT_PROMPT_FIELD = "question"  # data.prompt_field's default; a row with only TRL's `prompt` uses that


class CustomTask(RowTask):
    def __init__(self, source: RowSource, name: str = "file", prompt_field: str = "question",
                 answer_field: str = "answer", answer_required: bool = True, chat: bool = True,
                 timeout_s: float = 5.0) -> None:
        self.source, self.name, self.chat, self.timeout_s = source, name, chat, timeout_s
        self.prompt_field, self.answer_field, self.answer_required = prompt_field, answer_field, answer_required

    def score(self, completion: str, example: Example) -> float:
        if reference_number(example.answer) is not None:  # read once per answer, and never at length
            return math_equal(example.answer, completion, self.timeout_s)
        return float(_squash(completion) == _squashed_reference(example.answer))

    def grade(self, completion: str, example: Example) -> float | Deferred:
        """The reward service's form of `score`: symbolic checks come back as a Deferred for its workers."""
        if reference_number(example.answer) is not None:
            return grade(example.answer, completion)
        return self.score(completion, example)

    def _example(self, row: dict[str, Any], where: str, split: str, index: int) -> Example | None:
        skip = self.source.skip_bad_rows
        name = self.prompt_field
        if name == DEFAULT_PROMPT_FIELD and name not in row and "prompt" in row:
            name = "prompt"  # TRL's column, as its datasets have it
        prompt = field_value(row, name, where, skip, hint="; set data.prompt_field")
        if prompt is None:
            return None
        messages = conversation(prompt, f"{where}: field '{name}'") if isinstance(prompt, list) else None
        if messages is not None:
            prompt = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
        elif not isinstance(prompt, str):
            raise DataError(f"{where}: field '{self.prompt_field}' is a {type(prompt).__name__}, expected the "
                            f"prompt text (a string); data.system_prompt sets a system message")
        if self.answer_required:
            hint = "; set data.answer_field, or reward.functions to score without reference answers"
            answer = field_value(row, self.answer_field, where, skip, hint=hint)
            if answer is None:
                return None
        else:
            answer = row.get(self.answer_field)
        if isinstance(answer, (bytes, bytearray)):  # an optional answer field_value did not read
            answer = field_value(row, self.answer_field, where, skip)
        if isinstance(answer, (dict, list, tuple)):  # a Parquet map or list: its repr is no reference answer
            raise DataError(f"{where}: field '{self.answer_field}' is a {type(answer).__name__}, expected the answer "
                            "as text or a number (reward functions still get the column as it is)")
        return Example(uid=f"{self.name}-{split}-{index}", prompt=prompt,
                       answer="" if answer is None else str(answer).strip(), row=row, messages=messages)


def conversation(value: list[Any], where: str) -> list[dict[str, str]]:
    """A prompt column holding TRL's conversational format: a non-empty list of {role, content}."""
    ok = bool(value) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                             and isinstance(m.get("content"), str) for m in value)
    if not ok:
        raise DataError(f"{where}: expected a prompt string or a list of messages "
                        '[{"role": "user", "content": "..."}, ...]')
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _squash(text: str) -> str:
    return " ".join(text.split())


_squashed_reference = functools.lru_cache(maxsize=4096)(_squash)  # a group's completions share one answer
