"""Training prompts in a seeded shuffled order, epoch after epoch, with a cursor for resume.

Under torchrun every rank shuffles the same way and takes every N-th prompt of the stream (rank r:
positions r, r + N, r + 2N, ...), so the ranks' prompts never overlap and one process (N = 1) draws
the whole stream, as before."""
from __future__ import annotations

import random
from collections.abc import Callable

from .tasks.base import Example


class PromptSource:
    def __init__(self, examples: list[Example], encode: Callable[[Example], list[int]], seed: int,
                 cursor: int = 0, stride: int = 1, offset: int = 0) -> None:
        """`cursor` counts this source's own draws; `stride`, `offset`: world size and rank."""
        if not examples:
            raise ValueError("no training examples")
        self.examples, self.encode, self.seed, self.cursor = examples, encode, seed, cursor
        self.stride, self.offset = stride, offset
        self._epoch, self._order = -1, list(range(len(examples)))

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.examples)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def next(self) -> tuple[Example, list[int]]:
        epoch, index = divmod(self.cursor * self.stride + self.offset, len(self.examples))
        self.cursor += 1
        example = self.examples[self._order_of(epoch)[index]]
        return example, self.encode(example)
