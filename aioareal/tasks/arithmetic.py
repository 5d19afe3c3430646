"""Synthetic arithmetic: 'a+b=' -> 'c', generated in code, exact-match verified.

Every operand pair is enumerated once and split by a seeded shuffle, so held-out prompts are
never seen in training (nor in the tiny model's warm-start).
"""
from __future__ import annotations

import itertools
import random

from .base import Example

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticTask:
    name = "arithmetic"
    chat = False

    def __init__(self, digits: int = 2, ops: str = "+", eval_size: int = 200, seed: int = 1234,
                 max_pool: int = 200_000) -> None:
        self.digits, self.ops, self.eval_size, self.seed, self.max_pool = digits, ops, eval_size, seed, max_pool

    def splits(self) -> tuple[list[Example], list[Example]]:
        rng = random.Random(self.seed)
        top = 10 ** self.digits
        space = top * top * len(self.ops)
        if space <= self.max_pool:
            triples = [(a, op, b) for op in self.ops for a, b in itertools.product(range(top), repeat=2)]
            rng.shuffle(triples)
        else:  # too many to enumerate: sample distinct triples
            seen: set[tuple[int, str, int]] = set()
            while len(seen) < self.max_pool:
                seen.add((rng.randrange(top), rng.choice(self.ops), rng.randrange(top)))
            triples = sorted(seen)
            rng.shuffle(triples)
        examples = [self.example(a, op, b) for a, op, b in triples]
        return examples[self.eval_size:], examples[: self.eval_size]

    @staticmethod
    def example(a: int, op: str, b: int) -> Example:
        answer = str(OPERATORS[op](a, b))
        return Example(uid=f"{a}{op}{b}", prompt=f"{a}{op}{b}=", answer=answer,
                       row={"a": a, "b": b, "op": op, "answer": answer})

    def score(self, completion: str, example: Example) -> float:
        return float(completion.strip() == example.answer)
