"""`warmup`: the tiny model's supervised warm-start (one section of the typed config, schema.py)."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import check, doc


@dataclass
class WarmupConfig:
    target_pass_rate: float = doc("tiny model: supervised warm-start stops at this held-out pass rate", 0.3)
    max_steps: int = doc("tiny model: warm-start step limit", 3000)
    batch_size: int = doc("tiny model: warm-start batch size", 128)
    lr: float = doc("tiny model: warm-start learning rate", 1e-3)
    ops: str = doc("tiny model: operators of the warm-start's sums (empty = arithmetic.ops)", "")
    digits: int = doc("tiny model: operands of 1 to this many digits in the warm-start, each length equally "
                      "likely (0 = arithmetic.digits, drawn as the task draws them)", 0)
    calls: bool = doc("tiny model: teach the calculator episode's call format (a+b=[a+b]{c}c) instead "
                      "of direct answers (the calculator episode's warm-start)", False)

    extra_ops: str = doc("tiny model: operators the warm-start also teaches with one short operand "
                         "(warmup.extra_digits; the other of up to warmup.digits), a quarter of each batch", "")
    extra_digits: int = doc("tiny model: max digits of the short operand of those (1: products by one digit, "
                            "12345*6 and 6*12345)", 1)
    extra_calls: float = doc("tiny model: the fraction of those taught in the calculator's call format (with "
                             "warmup.calls; the rest answered directly)", 0.0)

    def __post_init__(self) -> None:
        check(not set(self.ops) - set("+-*%"), "warmup.ops", f"must use only '+-*%', got '{self.ops}'")
        check(not set(self.extra_ops) - set("+-*%"), "warmup.extra_ops", f"must use only '+-*%', got "
              f"'{self.extra_ops}'")
        check(0 <= self.extra_calls <= 1, "warmup.extra_calls", f"must be in 0..1, got {self.extra_calls}")
        check(1 <= self.extra_digits <= 6, "warmup.extra_digits", f"must be in 1..6, got {self.extra_digits}")
        check(0 <= self.digits <= 6, "warmup.digits", f"must be in 0..6, got {self.digits}")
        check(0 < self.target_pass_rate < 1, "warmup.target_pass_rate",
              f"must be in (0, 1), got {self.target_pass_rate}")
