"""Synthetic arithmetic (+, -, * and %, the remainder), generated in code, in three styles:

  raw       '23+45=' -> '68', exact match: the tiny model's format (no chat template)
  chat      'What is 23 + 45? Put the final answer in \\boxed{}.' through the chat template, graded by
            the GSM8K grader: an instruct model's format
  question  'Question: What is 23 plus 45?\\nAnswer:' as raw text, graded by the answer on its first
            line: a base model's format (it goes on writing the next question, which is not read)

Every operand pair is enumerated once and split by a seeded shuffle: held-out prompts are never trained.
"""
from __future__ import annotations

import itertools
import random
import re

from ..grading.verify import Deferred, grade, grade_now
from ..group import Example

STYLES = ("raw", "chat", "question")

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "%": lambda a, b: a % b}
INSTRUCTION = "Put the final answer in \\boxed{}."
WORDS = {"+": "plus", "-": "minus", "*": "times", "%": "modulo"}
# An integer, its sign kept. Bounded: a line of digits only costs linear time.
NUMBER = re.compile(r"-?\d+")


class ArithmeticTask:
    name = "arithmetic"

    def __init__(self, digits: int = 2, ops: str = "+", eval_size: int = 200, seed: int = 1234,
                 max_pool: int = 200_000, style: str = "raw", max_operand: int = 0) -> None:
        if style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
        self.digits, self.ops, self.eval_size, self.seed, self.max_pool = digits, ops, eval_size, seed, max_pool
        self.style = style
        self.top = max_operand + 1 if max_operand else 10 ** digits  # operands 0 .. top - 1
        self.chat = style == "chat"  # the renderer wraps chat prompts in the tokenizer's template

    def splits(self) -> tuple[list[Example], list[Example]]:
        rng = random.Random(self.seed)
        top = self.top
        space = top * top * len(self.ops)
        if space <= self.max_pool:
            triples = [(a, op, b) for op in self.ops for a, b in itertools.product(range(top), repeat=2)
                       if b or op != "%"]
            rng.shuffle(triples)
        else:  # too many to enumerate: sample distinct triples
            seen: set[tuple[int, str, int]] = set()
            while len(seen) < self.max_pool:
                a, op, b = rng.randrange(top), rng.choice(self.ops), rng.randrange(top)
                if b or op != "%":  # no remainder of a division by zero
                    seen.add((a, op, b))
            triples = sorted(seen)
            rng.shuffle(triples)
        examples = [self.example(a, op, b, self.style) for a, op, b in triples]
        return examples[self.eval_size:], examples[: self.eval_size]

    @staticmethod
    def example(a: int, op: str, b: int, style: str = "raw") -> Example:
        answer = str(OPERATORS[op](a, b))
        prompt = {"raw": f"{a}{op}{b}=", "chat": f"What is {a} {op} {b}? {INSTRUCTION}",
                  "question": f"Question: What is {a} {WORDS[op]} {b}?\nAnswer:"}[style]
        row = {"a": a, "b": b, "op": op, "answer": answer}
        return Example(uid=f"{a}{op}{b}", prompt=prompt, answer=answer, row=row)

    def score(self, completion: str, example: Example) -> float:
        if self.style == "raw":
            return float(completion.strip() == example.answer)
        if self.style == "question":
            return float(line_answer(completion) == example.answer)
        return grade_now([example.answer], [completion])[0]

    def grade(self, completion: str, example: Example) -> float | Deferred:
        """The reward service's form (the chat style's answers are numbers: decided in the thread)."""
        return self.score(completion, example) if self.style != "chat" else grade(example.answer, completion)


def line_answer(text: str) -> str | None:
    """The question style's answer: the last integer on the first line that has text, canonical
    ("007" is "7"): " 23 + 45 = 68\n\nQuestion: ..." -> "68"; None without one (or past 40 digits)."""
    line = next((part for part in text.split("\n") if part.strip()), "")
    found = NUMBER.findall(line)
    if not found or len(found[-1].lstrip("-")) > 40:
        return None
    return str(int(found[-1]))
