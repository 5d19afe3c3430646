"""Daemon threads for the reward service's in-process stage, reused from call to call.

Starting a thread per call blocks the event loop until the new thread has run (`Thread.start` waits
for it to signal): a wait on every call, for every group, and the longer the busier the machine.
These threads are reused instead, and a new one starts only when none is idle. A call that overruns
its timeout cannot be stopped: its thread is written off (it keeps running; the service counts it as
hung) and work that arrives meanwhile gets a new thread, so hung calls never starve later ones.
Daemon threads rather than a ThreadPoolExecutor: an executor's threads are joined at interpreter
exit, so one verifier that never returns would hang shutdown.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


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
