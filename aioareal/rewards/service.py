"""The reward service: verifiers run off the event loop under one timeout, and every failure is counted.

A call scores one group in two stages, both inside the call's deadline (`timeout_s` from its start):

1. In-process, in a daemon thread (`threads.py`, reused): decode, then run the scorer (`score_group` keeps the
   texts on the completions, for samples.jsonl: decoded once, never on the event loop). Bounded work finishes here (the
   GSM8K fast path: linear-time answer finding, exact fractions), and so do users' reward
   functions under `reward.isolation=thread`. Python cannot kill a thread: a call that overruns is
   abandoned (`stats.hung`) without holding one of the `workers` slots, and MAX_HUNG of them end
   the run rather than pile up threads that compete for the GIL.
2. In worker processes (`pool.py`): what the scorer handed back as a `Deferred` (math-verify,
   or users' functions under `reward.isolation=process`). The pool kills and replaces a worker
   whose job still runs at the deadline, so a sympy call that never returns costs one timeout.

What a scorer may return is described below (`per_item`) (numbers, Deferreds, Exceptions; or one
Deferred for the group). A completion whose check timed out, raised, or gave something that is not
a finite number scores 0 and is counted: `stats.timeouts` (checks stopped by the deadline: a whole
call in stage 1, one job in stage 2), `stats.errors` (checks that raised or returned garbage,
numbers past Python's digit limit included), `stats.failures` (completions scored 0 by either, what
`score` returns as its second value). `stats.metrics()` is the part a metrics row takes.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..group import Example, Group
from ..isolation.pool import Deferred, Outcome, WorkerPool, shared_pool
from ..isolation.threads import GRACE_S, MAX_HUNG, DaemonThreads


@dataclass
class RewardStats:
    calls: int = 0
    failures: int = 0  # completions scored 0 because their check timed out or failed
    timeouts: int = 0  # checks stopped by the deadline
    errors: int = 0  # checks that raised or returned something that is not a finite number
    hung: int = 0  # timed-out stage-1 threads still running when last checked
    deferred: int = 0  # checks run in worker processes

    def metrics(self) -> dict[str, int]:
        """Cumulative counters for the metrics row."""
        return {"reward_timeouts": self.timeouts, "reward_errors": self.errors}


class RewardService:
    def __init__(self, scorer: BatchScorer, decode: Callable[[list[int]], str], workers: int = 4,
                 timeout_s: float = 10.0, pool: WorkerPool | None = None, memory_limit_mb: int | None = None) -> None:
        self.scorer, self.decode, self.timeout_s, self.workers = scorer, decode, timeout_s, workers
        self.memory_limit_mb = memory_limit_mb  # the shared pool's workers' cap (None: the pool's default)
        self.stats = RewardStats()
        self._pool = pool  # None: the process-wide pool, grown to `workers`, on the first Deferred
        self._lock = threading.Lock()
        self._slots: asyncio.Semaphore | None = None  # made on first use, inside the running loop
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._threads = DaemonThreads("reward")
        self._abandoned: list[Future] = []  # timed-out stage-1 calls, until their threads return
        self.preload: tuple[str, ...] | None = getattr(scorer, "worker_preload", None)
        if self.preload is not None:  # this scorer defers work: start the workers now, off the first call's clock
            self.pool.start(tuple(self.preload), workers)

    @property
    def pool(self) -> WorkerPool:
        if self._pool is None:
            self._pool = shared_pool(self.workers, memory_limit_mb=self.memory_limit_mb)
        return self._pool

    def wait_ready(self) -> None:
        """Block until the worker processes this scorer defers to are up (none: returns at once). A
        call's deadline counts from its start, so workers still starting, or replacing ones killed at an
        earlier deadline, would be charged to the first checks; callers that can wait (held-out
        scoring, from a plain thread) wait here first."""
        if self.preload is not None:
            self.pool.wait_ready()

    async def score_group(self, group: Group) -> tuple[list[float], int]:
        """Scores of a finished group's completions against its example, and how many failed; sets
        each completion's `text` to its decoded tokens (kept even when its check failed)."""
        completions = group.completions
        decoded: list[list[str]] = []
        scores = await self.score([c.tokens for c in completions], [group.example] * len(completions), decoded)
        for completion, text in zip(completions, decoded[0] if decoded else []):
            completion.text = text
        return scores

    async def score(self, completions: list[list[int]] | list[str], examples: Sequence[Any],
                    decoded: list[list[str]] | None = None) -> tuple[list[float], int]:
        """Scores for a group's completions and the number of them whose check failed (scored 0).
        `decoded` receives the texts as its one element once stage 1 decoded them (a call that times
        out before that leaves it empty)."""
        async with self._slot():  # at most `workers` stage-1 threads; a hung one gives its slot back
            self._check_hung()
            deadline = time.monotonic() + self.timeout_s
            staged = await self._in_process(completions, list(examples), decoded)
        if isinstance(staged, Outcome):  # the whole call failed in stage 1
            return self._failed_call(staged, len(completions))
        entries = await self._run_deferred(staged, len(completions), deadline)
        if isinstance(entries, Outcome):
            return self._failed_call(entries, len(completions))
        return self._tally(entries)

    def scorer_metrics(self) -> dict[str, float]:
        """The scorer's own figures for a metrics row (reward functions: each one's mean and std), if any."""
        metrics = getattr(self.scorer, "metrics", None)
        return metrics() if callable(metrics) else {}

    def close(self) -> None:
        """Nothing to shut down here: stage-1 threads are daemons; worker pools end at interpreter exit
        (`pool.py`), or with the `close` of whoever made them."""

    # --- stage 1: in-process ----------------------------------------------------------------------

    def _slot(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self.workers), loop
        return self._slots

    async def _in_process(self, completions: list[list[int]] | list[str], examples: list[Any],
                          decoded: list[list[str]] | None) -> Any:
        """The scorer's result, or an Outcome when it timed out or raised."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()

        def deliver(value: Any) -> None:
            if not result.done():  # a timed-out call's late result is dropped
                result.set_result(value)

        def work() -> None:
            value = self._run_scorer(completions, examples, decoded)
            try:
                loop.call_soon_threadsafe(deliver, value)
            except RuntimeError:  # the loop closed while a hung verifier ran: nobody waits any more
                pass

        running = self._threads.submit(work)
        try:
            return await asyncio.wait_for(result, self.timeout_s)
        except TimeoutError:
            with self._lock:
                self._abandoned = [f for f in self._abandoned if not f.done()] + [running]
                self.stats.hung = len(self._abandoned)
            return Outcome("timeout", message=f"scorer still running after {self.timeout_s}s")

    def _run_scorer(self, completions: list[list[int]] | list[str], examples: list[Any],
                    decoded: list[list[str]] | None) -> Any:
        try:
            # Token ids are decoded here, off the loop; an episode's final answer comes as its text.
            texts = [c if isinstance(c, str) else self.decode(c) for c in completions]
            if decoded is not None:  # one append, atomic under the GIL: the loop sees no texts or all of them
                decoded.append(texts)
            if getattr(self.scorer, "takes_completion_ids", False):  # TRL's `completion_ids` for reward functions
                ids = [c for c in completions if not isinstance(c, str)]
                value = self.scorer(texts, examples, completion_ids=ids if len(ids) == len(texts) else None)
            else:
                value = self.scorer(texts, examples)
            return list(value) if isinstance(value, Iterator) else value  # drain a generator here, not on the loop
        except Exception as e:  # a verifier (or detokenizer) bug must not end a long run: counted
            return Outcome("error", message=f"{type(e).__name__}: {e}")

    def _check_hung(self) -> None:
        """Occasional hangs score 0 and the run goes on; a verifier that hangs for good would pile
        up threads (each competing for the GIL) while every reward reads 0, so that ends the run."""
        with self._lock:
            self._abandoned = [f for f in self._abandoned if not f.done()]
            self.stats.hung = len(self._abandoned)
        if self.stats.hung >= MAX_HUNG:
            raise UserError(f"{self.stats.hung} reward verifier calls are still running long after reward.timeout_s="
                            f"{self.timeout_s}s: the verifier hangs; fix it, raise the timeout, or set "
                            f"reward.isolation=process so that hung calls can be killed")

    # --- stage 2: worker processes ----------------------------------------------------------------

    async def _run_deferred(self, staged: Any, n: int, deadline: float) -> list[Any] | Outcome:
        """One entry per completion, each a value or a failed Outcome; an Outcome if the batch failed."""
        if isinstance(staged, Deferred):  # the whole group's scores from one worker call
            outcome = await self._run(staged, deadline)
            if not outcome.ok:
                return outcome
            staged = outcome.value
        if isinstance(staged, (str, bytes, dict)) or not hasattr(staged, "__len__") or len(staged) != n:
            return Outcome("error", message=f"the scorer returned {type(staged).__name__}, not {n} scores")
        entries = list(staged)
        jobs = {i: e for i, e in enumerate(entries) if isinstance(e, Deferred)}
        if jobs:
            outcomes = await asyncio.gather(*(self._run(d, deadline) for d in jobs.values()))
            for i, outcome in zip(jobs, outcomes):
                entries[i] = outcome.value if outcome.ok else outcome
        return entries

    async def _run(self, job: Deferred, deadline: float) -> Outcome:
        self.stats.deferred += 1
        future = self.pool.submit(job.fn, job.args, deadline=deadline)
        try:  # the pool resolves every job by its deadline; the grace only guards against a pool bug
            return await asyncio.wait_for(asyncio.wrap_future(future), deadline - time.monotonic() + GRACE_S)
        except TimeoutError:
            return Outcome("timeout", message="the worker pool did not answer")

    # --- counting ----------------------------------------------------------------------------------

    def _failed_call(self, outcome: Outcome, n: int) -> tuple[list[float], int]:
        self.stats.calls += 1
        self._count(outcome.status)
        self.stats.failures += n
        return [0.0] * n, n

    def _tally(self, entries: list[Any]) -> tuple[list[float], int]:
        scores, bad = [], 0
        for x in entries:
            ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            scores.append(float(x) if ok else 0.0)
            if not ok:
                bad += 1
                self._count(x.status if isinstance(x, Outcome) else "error")
        self.stats.calls += 1
        self.stats.failures += bad
        return scores, bad

    def _count(self, status: str) -> None:
        if status == "timeout":
            self.stats.timeouts += 1
        else:
            self.stats.errors += 1


# Scorers: the batch form of a task's verdict that the reward service takes.
#
# A scorer is called as `scorer(texts, examples)` with the decoded completions of one group and
# their examples, and returns one entry per completion: a number; an `isolation.pool.Deferred` check
# whose result is that completion's number (work that may run unbounded, done in a worker process);
# or an Exception (that completion's check failed: scored 0 and counted). It may instead return one
# `Deferred` whose result is the whole list. A scorer with a `worker_preload` attribute defers work:
# the service starts its worker processes (importing those modules) before the first call.
BatchScorer = Callable[[list[str], list[Example]], Sequence[Any]]


def per_item(score: Callable[[str, Example], Any]) -> BatchScorer:
    """Adapt a one-completion `score` to the batch form; one completion's failure is its own."""
    def batch(texts: list[str], examples: list[Example]) -> list[Any]:
        out: list[Any] = []
        for text, example in zip(texts, examples):
            try:
                out.append(score(text, example))
            except Exception as e:  # counted by the reward service; the group's other completions stand
                out.append(e)
        return out
    return batch


class GradedScorer:
    """A task whose `grade(completion, example)` returns a number or a Deferred symbolic check."""

    def __init__(self, grade: Callable[[str, Example], Any], preload: tuple[str, ...]) -> None:
        self.batch, self.worker_preload = per_item(grade), preload

    def __call__(self, texts: list[str], examples: list[Example]) -> list[Any]:
        return self.batch(texts, examples)
