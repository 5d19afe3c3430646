"""The reward service: verifiers run in worker threads with a timeout, never on the event loop.

A verifier that raises, hangs past the timeout, or returns something that is not a finite number
scores 0 and is counted; the run goes on. Python cannot kill a thread, so each call runs in its own
daemon thread: a hung verifier is abandoned (and counted in `stats.hung`) without holding one of
the `workers` slots, so hung calls never starve later ones, and it cannot block the process exit
the way a ThreadPoolExecutor's joined workers would.
"""
from __future__ import annotations

import asyncio
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .errors import UserError
from .tasks.base import Example

# Verifier threads still running after their timeout, beyond which the run stops (see _check_hung).
MAX_HUNG = 64

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
    hung: int = 0  # timed-out calls whose threads were still running when last checked


class RewardService:
    def __init__(self, scorer: BatchScorer, decode: Callable[[list[int]], str], workers: int = 4,
                 timeout_s: float = 10.0) -> None:
        self.scorer, self.decode, self.timeout_s = scorer, decode, timeout_s
        self.workers = workers
        self.stats = RewardStats()
        self._lock = threading.Lock()
        self._slots: asyncio.Semaphore | None = None  # made on first use, inside the running loop
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._abandoned: list[threading.Thread] = []

    def _score_sync(self, completions: list[list[int]], examples: list[Example]) -> tuple[list[float], int]:
        try:
            texts = [self.decode(c) for c in completions]
            raw = list(self.scorer(texts, examples))
        except Exception:  # a verifier (or detokenizer) bug must not end a long run: score 0, count it
            return [0.0] * len(completions), len(completions)
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
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self.workers), loop
        async with self._slots:  # at most `workers` verifiers run at once; a hung one gives its slot back
            self._check_hung()
            future, thread = self._start(completions, examples)
            try:
                scores, bad = await asyncio.wait_for(future, self.timeout_s)
            except asyncio.TimeoutError:
                with self._lock:
                    self._abandoned = [t for t in self._abandoned if t.is_alive()] + [thread]
                    self.stats.calls += 1
                    self.stats.timeouts += 1
                    self.stats.failures += len(completions)
                    self.stats.hung = len(self._abandoned)
                return [0.0] * len(completions), len(completions)
        with self._lock:
            self.stats.calls += 1
            self.stats.failures += bad
        return scores, bad

    def _check_hung(self) -> None:
        """Occasional hangs score 0 and the run goes on; a verifier that hangs for good would pile
        up threads (each competing for the GIL) while every reward reads 0, so that ends the run."""
        with self._lock:
            self._abandoned = [t for t in self._abandoned if t.is_alive()]
            self.stats.hung = len(self._abandoned)
        if self.stats.hung >= MAX_HUNG:
            raise UserError(f"{self.stats.hung} reward verifier calls are still running long after reward.timeout_s="
                            f"{self.timeout_s}s: the verifier hangs; fix it or raise the timeout")

    def _start(self, completions: list[list[int]],
               examples: list[Example]) -> tuple[asyncio.Future[Any], threading.Thread]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def deliver(result: tuple[list[float], int]) -> None:
            if not future.done():  # a timed-out call's late result is dropped
                future.set_result(result)

        def work() -> None:
            result = self._score_sync(completions, examples)
            try:
                loop.call_soon_threadsafe(deliver, result)
            except RuntimeError:  # the loop closed while a hung verifier ran: nobody waits any more
                pass

        thread = threading.Thread(target=work, name="reward", daemon=True)
        thread.start()
        return future, thread

    def close(self) -> None:
        """Nothing to shut down: verifier threads are daemons and end with their call."""
