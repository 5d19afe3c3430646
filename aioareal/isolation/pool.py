"""Worker processes for verifier work that may never end, killed and replaced when it overruns.

A thread cannot be stopped, and code holding the GIL (sympy on `9^{9^{9}}`) stalls every thread, the
event loop included; a process can be killed. So unbounded work goes over as a `Deferred` to a spawned,
reused worker (worker.py). One dispatcher thread owns the workers: it hands out jobs, waits on pipes and
expiry times, and resolves each future with an `Outcome`; on expiry it SIGKILLs the worker and spawns
a replacement whose start-up is charged to no job (`ProcessPoolExecutor` breaks when one worker is
killed). A job expires `timeout_s` after it starts, or at its absolute `deadline`; one that ran out
of memory is an error and its worker is replaced. Workers end with the parent.
"""
from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from .worker import CONTEXT, DEFAULT_MEMORY_MB, Deferred, Outcome, kill_worker, serve, start_worker

__all__ = ["Deferred", "Outcome", "WorkerPool", "shared_pool"]
MAX_FAILED_STARTS = 3  # workers in a row that die before they are ready: the pool gives up


@dataclass
class _Job:
    fn: str
    args: tuple[Any, ...]
    timeout_s: float | None
    deadline: float | None  # time.monotonic() seconds
    future: Future = field(default_factory=Future)
    started: float | None = None

    def expiry(self) -> float | None:
        running = None if self.started is None or self.timeout_s is None else self.started + self.timeout_s
        return min((t for t in (self.deadline, running) if t is not None), default=None)


@dataclass
class _Worker:
    process: Any  # multiprocessing.Process (spawn context)
    conn: Connection
    ready: bool = False
    job: _Job | None = None


class WorkerPool:
    """`size` spawned worker processes; thread-safe; nothing starts until `start` or the first job."""

    def __init__(self, size: int, preload: tuple[str, ...] = (), memory_limit_mb: int = DEFAULT_MEMORY_MB) -> None:
        self.size, self.preload, self.pid, self.memory_limit_mb = size, tuple(preload), os.getpid(), memory_limit_mb
        self.restarts = 0  # workers killed (timeout) or lost (crash) and replaced
        self._lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._queue_deadline: float | None = None  # earliest deadline among queued jobs (or earlier)
        self._workers: list[_Worker] = []
        self._wake_r, self._wake_w = CONTEXT.Pipe(duplex=False)
        self._thread: threading.Thread | None = None
        self._closed, self._broken, self._woken = False, "", False
        self._failed_starts = 0
        _POOLS.add(self)

    def start(self, preload: tuple[str, ...] = (), size: int | None = None, spawn: bool = True) -> WorkerPool:
        """Grow the pool (`size` workers, `preload` imported) and spawn the workers now, where they warm
        up in the background; with spawn=False a pool that has not started only remembers."""
        with self._lock:
            added = tuple(m for m in preload if m not in self.preload)
            self.preload += added
            self.size = max(self.size, size or 0)
            if self._closed or (not spawn and self._thread is None):
                return self
            for module in added:  # workers already running import it now rather than in a timed job
                self._queue.extend(_Job(f"{serve.__module__}:warm", (module,), None, None) for _ in self._workers)
            while len(self._workers) < self.size:
                self._workers.append(self._spawn())
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="reward-pool", daemon=True)
                self._thread.start()
        self._wake()
        return self

    def submit(self, fn: str, args: tuple[Any, ...] = (), timeout_s: float | None = None,
               deadline: float | None = None) -> Future:
        """Future of the job's `Outcome`; always resolved, by `timeout_s` of running or `deadline`."""
        job = _Job(fn, tuple(args), timeout_s, deadline)
        self.start()
        with self._lock:
            if self._closed or self._broken:
                _resolve(job, Outcome("error", message=self._broken or "worker pool closed"))
                return job.future
            self._queue.append(job)
            if deadline is not None:
                self._queue_deadline = min(deadline, self._queue_deadline or deadline)
        self._wake()
        return job.future

    def run(self, fn: str, args: tuple[Any, ...] = (), timeout_s: float | None = None) -> Outcome:
        return self.submit(fn, args, timeout_s).result()

    def wait_ready(self, timeout_s: float = 30.0) -> bool:
        """Block until every worker has started (tests and benchmarks: keep start-up out of timings)."""
        self.start()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if self._broken or all(w.ready for w in self._workers):
                    return not self._broken
            time.sleep(0.01)
        return False

    def pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in self._workers]

    def close(self) -> None:
        """Kill the workers; jobs still queued or running resolve as errors."""
        with self._lock:
            self._closed = True
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        with self._lock:
            for worker in self._workers:
                self._stop(worker, "worker pool closed")
            self._workers.clear()
            self._fail_queued("worker pool closed")

    # --- the dispatcher thread ------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while self._step():
                pass
        except Exception as e:  # a bug here must not leave callers waiting forever: fail loudly instead
            with self._lock:
                self._broken = f"reward worker pool failed: {type(e).__name__}: {e}"
                for worker in self._workers:
                    self._stop(worker, self._broken)
                self._workers.clear()
                self._fail_queued(self._broken)

    def _step(self) -> bool:
        """One round: expire, dispatch, then sleep until a pipe is readable or a job expires."""
        with self._lock:
            if self._closed:
                return False
            now = time.monotonic()
            self._expire(now)
            self._dispatch(now)
            conns = [self._wake_r] + [w.conn for w in self._workers]
            running = (w.job.expiry() for w in self._workers if w.job is not None)
            expiry = min((e for e in (*running, self._queue_deadline) if e is not None), default=None)
        timeout = None if expiry is None else max(0.0, expiry - time.monotonic())
        ready = wait(conns, timeout)
        with self._lock:
            for conn in ready:
                self._on_readable(conn)
        return True

    def _expire(self, now: float) -> None:
        # The queue is scanned only once its earliest deadline has passed (_queue_deadline may be
        # early, never late), so a round costs O(workers), not O(queued jobs).
        if self._queue_deadline is not None and self._queue_deadline <= now:
            expired = [j for j in self._queue if j.deadline is not None and j.deadline <= now]
            self._queue = deque(j for j in self._queue if j.deadline is None or j.deadline > now)
            self._queue_deadline = min((j.deadline for j in self._queue if j.deadline is not None), default=None)
            for job in expired:
                _resolve(job, Outcome("timeout", message="no worker became free before the deadline"))
        for i, worker in enumerate(self._workers):
            expiry = worker.job.expiry() if worker.job is not None else None
            if expiry is not None and expiry <= now:
                self.restarts += 1
                self._stop(worker, "")
                self._workers[i] = self._spawn()

    def _dispatch(self, now: float) -> None:
        for worker in self._workers:
            if not (worker.ready and worker.job is None):
                continue
            while self._queue and worker.job is None:
                job = self._queue.popleft()
                if job.future.set_running_or_notify_cancel():  # False: its caller gave up waiting
                    job.started, worker.job = now, job
            if worker.job is not None:
                try:
                    worker.conn.send((worker.job.fn, worker.job.args))
                except (OSError, ValueError):  # died while idle: its pipe is closed; _on_readable replaces it
                    pass

    def _on_readable(self, conn: Any) -> None:
        if conn is self._wake_r:
            while self._wake_r.poll():
                self._wake_r.recv_bytes()
            self._woken = False
            return
        index = next((i for i, w in enumerate(self._workers) if w.conn is conn), None)
        if index is None:  # replaced since the wait began
            return
        worker = self._workers[index]
        try:
            status, value = conn.recv()
        except (EOFError, OSError):
            self._lost(index, worker)
            return
        if status == "ready":
            worker.ready, self._failed_starts = True, 0
        elif worker.job is not None:
            job, worker.job = worker.job, None
            _resolve(job, Outcome("ok", value) if status == "ok" else Outcome("error", message=value))
            if status == "error" and value.startswith("MemoryError"):  # ran out under its limit: a fresh one
                self._stop(worker, "")
                self.restarts, self._workers[index] = self.restarts + 1, self._spawn()

    def _lost(self, index: int, worker: _Worker) -> None:
        """A worker died on its own (crash, out of memory, killed from outside): replace it."""
        worker.process.join(2)  # reap it, so that its exit code is known
        code = worker.process.exitcode
        self._stop(worker, f"worker process died (exit code {code})")
        self._failed_starts = 0 if worker.ready else self._failed_starts + 1
        if self._failed_starts >= MAX_FAILED_STARTS:
            self._broken = f"reward worker processes die on start-up (exit code {code}; preload {self.preload})"
            self._workers.pop(index)
            self._fail_queued(self._broken)
            return
        self.restarts += 1
        self._workers[index] = self._spawn()

    def _stop(self, worker: _Worker, error: str) -> None:
        """Kill a worker; its job (if any) resolves as a timeout, or as `error` when one is given."""
        kill_worker(worker.process)  # and the processes it started (worker.py)
        worker.process.join(2)
        worker.conn.close()
        if worker.job is not None:
            _resolve(worker.job, Outcome("error", message=error) if error else Outcome(
                "timeout", message="killed: ran past its time limit"))
        worker.job = None

    def _fail_queued(self, message: str) -> None:
        while self._queue:
            _resolve(self._queue.popleft(), Outcome("error", message=message))

    def _spawn(self) -> _Worker:
        return _Worker(*start_worker(self.preload, self.memory_limit_mb))

    def _wake(self) -> None:
        """Interrupt the dispatcher's wait. At most one wake-up is ever in the pipe: a full pipe
        would block a submitter that holds the lock the dispatcher needs to drain it."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive() and not self._woken:
                self._woken = True
                self._wake_w.send_bytes(b"!")


def _resolve(job: _Job, outcome: Outcome) -> None:
    """Deliver an outcome once; a job whose caller cancelled its future is dropped quietly."""
    try:
        if not job.future.done():
            job.future.set_result(outcome)
    except InvalidStateError:  # cancelled between the check and the set
        pass


_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()
_shared: WorkerPool | None = None
_shared_lock = threading.Lock()


def shared_pool(size: int = 2, preload: tuple[str, ...] = (), memory_limit_mb: int | None = None) -> WorkerPool:
    """The process-wide pool, grown to the largest `size` and every `preload`; new workers capped at the limit."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared._closed or _shared.pid != os.getpid():  # a forked child starts its own
            _shared = WorkerPool(size, preload)
        else:
            _shared.start(preload, size, spawn=False)
        if memory_limit_mb is not None:
            _shared.memory_limit_mb = memory_limit_mb
        return _shared


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        if pool.pid == os.getpid():  # a forked child exiting must not kill its parent's workers
            pool.close()
