"""A coroutine run to completion from synchronous code, wherever that code is called from.

asyncio allows one running loop per thread, and `asyncio.run` refuses to start where one runs
already: in Jupyter and IPython (the kernel's loop runs the cell), or in an application's own loop.
There the coroutine runs on a thread of its own, with its own loop, and the caller's thread waits.
Everywhere else it is plain `asyncio.run`, on uvloop when installed (faster loop internals).

A run that hangs (a thread's call that never returns, a loop blocked by code that belongs on a
thread) cannot be stopped from the loop: `exit_stalled` ends the process with EXIT_STALLED and the
cause in one line (the run/events.py watchdog, orchestrator/workers.py's budgets)."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from .errors import one_line


def run_coroutine(coro: Coroutine[Any, Any, Any], on_interrupt: Callable[[], None] | None = None) -> Any:
    """`coro`'s result (or its exception). Beside a running loop, `on_interrupt` (when given) takes
    Ctrl-C while the coroutine runs, and the wait goes on: the coroutine is asked to end, not left
    running behind a returned call."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run(coro)
    return _run_beside(coro, on_interrupt)


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _run_beside(coro: Coroutine[Any, Any, Any], on_interrupt: Callable[[], None] | None) -> Any:
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = _run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised on the waiting thread
            outcome["error"] = e

    thread = threading.Thread(target=work, name="aioareal-loop", daemon=True)
    # On the main thread Ctrl-C is on_interrupt's while the coroutine runs: the running loop's own
    # handler (asyncio.run's) would only cancel the caller's task, which is waiting here.
    ours = on_interrupt is not None and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: on_interrupt()) if ours else None
    thread.start()
    try:
        while thread.is_alive():
            try:
                thread.join(0.1)
            except KeyboardInterrupt:
                if on_interrupt is None:
                    raise
                on_interrupt()
    finally:
        if ours:
            signal.signal(signal.SIGINT, previous)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


EXIT_STALLED = 3  # the exit status of a run ended because it hung
CLOSE_GRACE_S = 30.0  # after a stall, how long the run has to close before the process exits


def exit_stalled(cause: str) -> None:
    print(one_line(f"error: {cause}; exiting (status {EXIT_STALLED})"), file=sys.stderr, flush=True)
    os._exit(EXIT_STALLED)


def exit_unless(done: threading.Event, cause: str, grace_s: float | None = None) -> None:
    """End the process (exit_stalled) if `done` is not set within `grace_s` (CLOSE_GRACE_S)."""
    def check() -> None:
        if not done.is_set():
            exit_stalled(cause)
    timer = threading.Timer(CLOSE_GRACE_S if grace_s is None else grace_s, check)
    timer.daemon = True
    timer.start()
