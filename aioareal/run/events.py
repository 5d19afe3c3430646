"""The run's event loop and what reaches the terminal: uvloop when installed, the stop signals
(Ctrl-C, SIGTERM), and the plain per-step lines."""
from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..monitor.plain import plain_line

DUPLICATE_S = 0.1  # a second signal sooner than this is a duplicate delivery, not a second Ctrl-C


class Stoppable(Protocol):
    stop_requested: bool

    def request_stop(self, signum: int = 2) -> None: ...


@contextlib.contextmanager
def stop_signals(target: Stoppable) -> Iterator[None]:
    """First Ctrl-C / SIGTERM: finish the current step, checkpoint, exit cleanly. Second: exit now.
    `target` is the orchestrator, or under torchrun the rank's hooks, which stop every rank after one
    step (the cell says which). The handlers go when the block ends: the loop keeps what it is given,
    and a handler left behind would keep this run's models alive into the next run of a sweep."""
    loop = asyncio.get_running_loop()

    first: dict[int, float] = {}

    def stop(signum: int) -> None:
        now = time.monotonic()
        if now - first.get(signum, -math.inf) < DUPLICATE_S:
            return  # the same signal twice at once: `timeout` sends it to the process and to its group
        first.setdefault(signum, now)
        if target.stop_requested:
            # Immediate exit is safe: checkpoints are renamed into place and metrics lines are
            # single appends that a resume repairs.
            print("exiting now", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        print(f"\n{signal.Signals(signum).name}: finishing the current step and checkpointing "
              "(press Ctrl-C again to exit at once)", file=sys.stderr, flush=True)
        target.request_stop(signum)

    installed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop, signum)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
            break
        installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def run_event_loop(coro: Any) -> Any:
    """asyncio.run on uvloop when it is installed (faster loop internals), plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def quiet(*_: Any) -> None:
    pass


def step_printer(log: Callable[[str], None], steps: int, evals_only: bool) -> Callable[[dict[str, Any]], None]:
    """One plain line per step; above a dashboard (which shows the rest) only evaluation steps."""
    def print_row(row: dict[str, Any]) -> None:
        if not evals_only or row.get("eval_pass_rate") is not None:
            log(plain_line(row, steps))
    return print_row
