"""Admission and batching rules (docs/architecture.md rules 1 and 2), as plain bookkeeping with no
I/O: a new group starts only while accepted + running < (K + v + 1) * B (AReaL, arXiv 2505.24298,
eq. 3), and batches are the B oldest groups *by admission order*, which together bound every trained
sample's staleness by K (the oldest *finished* groups would not).
"""
from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..group import Example, Group


@dataclass
class Admission:
    batch_groups: int  # B
    max_staleness: int  # K
    accepted: int = 0  # groups finished and kept, cumulative (minus groups dropped as stale)
    running: int = 0  # admitted, not yet finished

    def capacity(self, version: int) -> int:
        """How many more groups may start at `version`."""
        return (self.max_staleness + version + 1) * self.batch_groups - self.accepted - self.running

    def admit(self) -> None:
        self.running += 1

    def finish(self, kept: bool) -> None:
        self.running -= 1
        self.accepted += kept

    def drop_accepted(self, n: int = 1) -> None:
        """Groups dropped by the replay filter free their place."""
        self.accepted -= n

    def restore(self, version: int) -> None:
        """On resume: every accepted group up to `version` was trained; nothing is running."""
        self.accepted, self.running = version * self.batch_groups, 0


@dataclass
class Ledger:
    """Group counts that must add up: admitted = trained + dropped_stale + rejected + in_flight."""

    admitted: int = 0
    trained: int = 0
    dropped_stale: int = 0
    rejected: int = 0

    @property
    def in_flight(self) -> int:
        return self.admitted - self.trained - self.dropped_stale - self.rejected


class OldestFirstBuffer:
    """Finished groups, handed to the trainer strictly in admission order."""

    def __init__(self) -> None:
        self.order: deque[int] = deque()
        self.done: dict[int, Group] = {}
        self._changed = asyncio.Event()

    def admitted(self, group_id: int) -> None:
        self.order.append(group_id)

    def finished(self, group: Group) -> None:
        self.done[group.group_id] = group
        self._changed.set()

    def rejected(self, group_id: int) -> None:
        self.order.remove(group_id)
        self._changed.set()

    def ready(self) -> int:
        """Groups at the head of the line that are finished (what the next batch could take now)."""
        n = 0
        for gid in self.order:
            if gid not in self.done:
                break
            n += 1
        return n

    async def take(self, n: int) -> list[Group]:
        while self.ready() < n:
            self._changed.clear()
            await self._changed.wait()
        return [self.done.pop(self.order.popleft()) for _ in range(n)]


# -- the prompt source ---------------------------------------------------------------------------------
# Training prompts in a seeded shuffled order, epoch after epoch, with a cursor for resume. With
# data.order=easy-first the first epoch runs from the shortest reference answer to the longest (a
# curriculum: GSM8K's answer length counts the steps). Under torchrun rank r takes positions
# r, r + N, r + 2N, ... of the same shuffled stream.
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
