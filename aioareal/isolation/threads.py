"""Daemon threads for the reward service's in-process stage, reused from call to call: starting a
thread per call blocks the event loop until it runs (`Thread.start` waits for its signal). A call past
its timeout cannot be stopped: its thread is written off (counted as hung) and later work gets a new
one. Daemon threads, not a ThreadPoolExecutor, whose threads are joined at exit: one verifier that
never returns would hang shutdown.

`BoundedThreads` is the capped kind, for user code nothing else bounds (plain tools, `GuardedCaller`):
at most `limit` threads; once all are stuck past their timeout, further calls fail at once.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from .pool import Deferred, Outcome, WorkerPool, shared_pool

MAX_HUNG = 64  # stage-1 threads still running after their timeout, beyond which the run stops
GRACE_S = 2.0  # how long past the deadline to wait for the pool to report a kill (it never should)


class DaemonThreads:
    def __init__(self, name: str = "reward") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job (or about to)

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Run fn() in a daemon thread; the future is done when fn returns (or was cancelled unstarted)."""
        future: Future = Future()
        with self._lock:
            grow = self._idle == 0
            if not grow:
                self._idle -= 1
        self._jobs.put((fn, future))
        if grow:
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:  # fn reports its own errors; this keeps the thread alive
                    future.set_exception(e)
            with self._lock:
                self._idle += 1


class Saturated(RuntimeError):
    """Every thread of a `BoundedThreads` is still running a call its caller gave up on."""


class BoundedThreads:
    """At most `limit` daemon threads, reused; work beyond them waits in a queue for a free one. A
    caller that stops waiting `abandon`s its call: a queued one is cancelled, a running one keeps its
    thread until it returns. When every thread is held so, `submit` raises `Saturated` at once, a
    counted failure rather than thread after thread for code that hangs (docs/reliability.md)."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit, self.name = max(1, limit), name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = self._waiting = self._busy = 0
        self._stuck: set[Future] = set()  # abandoned calls still running

    @property
    def stuck(self) -> int:
        with self._lock:
            self._stuck = {f for f in self._stuck if not f.done()}
            return len(self._stuck)

    @property
    def threads(self) -> int:
        return self._threads

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Future of fn()'s result (or exception); raises Saturated when every thread is stuck."""
        if self.stuck >= self.limit:
            raise Saturated(f"all {self.limit} {self.name} threads are still running calls that overran their "
                            f"timeout")
        future: Future = Future()
        with self._lock:
            grow = self._threads < self.limit and self._waiting + self._busy >= self._threads
            self._threads += grow
            self._waiting += 1
        self._jobs.put((fn, future))
        if grow:
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()
        return future

    def abandon(self, future: Future) -> None:
        """The caller stopped waiting: cancel the call if it has not started, else count it as stuck."""
        if not future.cancel() and not future.done():
            with self._lock:
                self._stuck.add(future)

    def _serve(self) -> None:
        while True:
            fn, future = self._jobs.get()
            with self._lock:
                self._waiting -= 1
                self._busy += 1
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as e:  # the caller reads it from the future; the thread lives on
                        future.set_exception(e)
            finally:
                with self._lock:
                    self._busy -= 1


# Users' reward functions called from a plain thread (the check before training, held-out evaluation)
# under the reward service's timeout, isolation and outcomes (ok, timeout, error), so one that hangs or
# runs out of memory there is a counted failure, never a hang (docs/architecture.md rule 8).
class GuardedCaller:
    """`call` runs one job, a callable (in a thread) or a `Deferred` (in a worker process), within `timeout_s`."""

    def __init__(self, timeout_s: float, workers: int = 4, memory_limit_mb: int | None = None,
                 max_hung: int = MAX_HUNG) -> None:
        self.timeout_s, self.workers, self.memory_limit_mb = timeout_s, workers, memory_limit_mb
        self._threads = BoundedThreads(max_hung, "reward-call")

    def pool(self, preload: tuple[str, ...] = ()) -> WorkerPool:
        return shared_pool(self.workers, preload, self.memory_limit_mb)

    def call(self, job: Callable[[], Any] | Deferred, preload: tuple[str, ...] = ()) -> Outcome:
        """The job's Outcome: ok, a timeout, or an error (a callable's `value`: the exception it raised)."""
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
