"""The reward service: verifiers run in a thread pool with a timeout, never on the event loop.

A verifier that raises, hangs past the timeout, or returns something that is not a finite number
scores 0 and is counted; the run goes on. A hung verifier thread cannot be killed (Python has no
thread cancellation), so the pool is sized with headroom and the count of hung calls is reported.
"""
from __future__ import annotations

import asyncio
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

from .tasks.base import Example

# completions (texts), examples (one per completion) -> one score per completion
BatchScorer = Callable[[list[str], list[Example]], Sequence[float]]


def per_item(score: Callable[[str, Example], float]) -> BatchScorer:
    """Adapt a task's one-completion `score` to the batch form."""
    return lambda texts, examples: [score(t, e) for t, e in zip(texts, examples)]


@dataclass
class RewardStats:
    calls: int = 0
    failures: int = 0  # raised or returned garbage
    timeouts: int = 0


class RewardService:
    def __init__(self, scorer: BatchScorer, decode: Callable[[list[int]], str], workers: int = 4,
                 timeout_s: float = 10.0) -> None:
        self.scorer, self.decode, self.timeout_s = scorer, decode, timeout_s
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reward")
        self.stats = RewardStats()
        self._lock = threading.Lock()

    def _score_sync(self, completions: list[list[int]], examples: list[Example]) -> tuple[list[float], int]:
        texts = [self.decode(c) for c in completions]
        try:
            raw = list(self.scorer(texts, examples))
        except Exception:  # a verifier bug must not end a long run: score 0, count it
            return [0.0] * len(texts), len(texts)
        if len(raw) != len(texts):
            return [0.0] * len(texts), len(texts)
        scores, bad = [], 0
        for x in raw:
            ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            scores.append(float(x) if ok else 0.0)
            bad += not ok
        return scores, bad

    async def score(self, completions: list[list[int]], examples: list[Example]) -> tuple[list[float], int]:
        """Scores for a group's completions and the number of failed verifications among them."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.pool, self._score_sync, completions, examples)
        try:
            scores, bad = await asyncio.wait_for(future, self.timeout_s)
        except asyncio.TimeoutError:
            with self._lock:
                self.stats.calls += 1
                self.stats.timeouts += 1
                self.stats.failures += len(completions)
            return [0.0] * len(completions), len(completions)
        with self._lock:
            self.stats.calls += 1
            self.stats.failures += bad
        return scores, bad

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
