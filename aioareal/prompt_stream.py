"""Training prompts in a seeded shuffled order, epoch after epoch, with a cursor for resume; with
data.order=easy-first the first epoch runs from the shortest reference answer to the longest (ties
in the seeded order), a curriculum for a model that solves too few of the hard prompts to learn
from them (GSM8K's answers are worked solutions: their length counts the steps).

Under torchrun every rank shuffles the same way and takes every N-th prompt of the stream (rank r:
positions r, r + N, r + 2N, ...), so the ranks' prompts never overlap and one process (N = 1) draws
the whole stream, as before."""
from __future__ import annotations

import random
from collections.abc import Callable

from .group import Example


class PromptSource:
    def __init__(self, examples: list[Example], encode: Callable[[Example], list[int]], seed: int,
                 cursor: int = 0, stride: int = 1, offset: int = 0, easy_first: bool = False) -> None:
        """`cursor` counts this source's own draws; `stride`, `offset`: world size and rank."""
        if not examples:
            raise ValueError("no training examples")
        self.examples, self.encode, self.seed, self.cursor = examples, encode, seed, cursor
        self.stride, self.offset, self.easy_first = stride, offset, easy_first
        self._epoch, self._order = -1, list(range(len(examples)))

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.examples)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            if epoch == 0 and self.easy_first:  # a stable sort: equal lengths keep the shuffled order
                self._order.sort(key=lambda i: len(self.examples[i].answer))
            self._epoch = epoch
        return self._order

    def next(self) -> tuple[Example, list[int]]:
        epoch, index = divmod(self.cursor * self.stride + self.offset, len(self.examples))
        self.cursor += 1
        example = self.examples[self._order_of(epoch)[index]]
        return example, self.encode(example)
