"""Users' reward functions called from a plain thread, under the reward service's deadline and isolation.

The reward service (`rewards/service.py`) serves the event loop. Two callers of users' reward functions run
outside it, each on a thread of its own: the check before training (`tasks/reward_functions.py`) and
held-out evaluation (on the trainer's thread). They call through a `GuardedCaller` instead of calling
in-process: the same timeout (`reward.timeout_s`), the same isolation (a bounded set of daemon threads
for `reward.isolation=thread`; the worker pool, which kills and replaces a worker at the deadline, for
`process`) and the same three outcomes (ok, timeout, error), so a function that hangs or runs out of
memory there is a counted failure or a one-line error, never a hang (docs/architecture.md rule 8).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from .pool import Deferred, Outcome, WorkerPool, shared_pool
from .threads import GRACE_S, MAX_HUNG, BoundedThreads, Saturated


class GuardedCaller:
    """`call` runs one job, a callable (in a thread) or a `Deferred` (in a worker process), within `timeout_s`."""

    def __init__(self, timeout_s: float, workers: int = 4, memory_limit_mb: int | None = None,
                 max_hung: int = MAX_HUNG) -> None:
        self.timeout_s, self.workers, self.memory_limit_mb = timeout_s, workers, memory_limit_mb
        self._threads = BoundedThreads(max_hung, "reward-call")

    def pool(self, preload: tuple[str, ...] = ()) -> WorkerPool:
        return shared_pool(self.workers, preload, self.memory_limit_mb)

    def call(self, job: Callable[[], Any] | Deferred, preload: tuple[str, ...] = ()) -> Outcome:
        """The job's Outcome: ok with its value, a timeout, or an error (for a callable, `value` holds the
        exception it raised, so that the caller can say where it came from)."""
        if isinstance(job, Deferred):
            pool = self.pool(preload)
            pool.wait_ready()  # workers starting up (or replacing a killed one): not charged to the job, as in training
            future = pool.submit(job.fn, job.args, deadline=time.monotonic() + self.timeout_s)
            try:  # the pool resolves every job by its deadline; the grace only guards against a pool bug
                return future.result(self.timeout_s + GRACE_S)
            except FutureTimeout:
                return Outcome("timeout", message="the worker pool did not answer")
        try:
            future = self._threads.submit(job)
        except Saturated as e:
            return Outcome("error", message=str(e))
        try:
            return Outcome("ok", future.result(self.timeout_s))
        except FutureTimeout:
            self._threads.abandon(future)
            return Outcome("timeout", message=f"still running after {self.timeout_s}s")
        except Exception as e:
            lines = str(e).strip().splitlines()
            return Outcome("error", e, f"{type(e).__name__}: {lines[0] if lines else ''}")
