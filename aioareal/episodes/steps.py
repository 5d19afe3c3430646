"""An episode's steps on the event loop, timed: one that holds the loop too long fails the episode.

An episode drives the engine through objects of the run's event loop (its turns' futures, the turn
queue), so unlike a tool (tools/toolbox.py: a thread and a loop of its own per call) it cannot be moved
off that loop. What it does between two awaits runs on the loop itself: a synchronous sleep or a long
computation there freezes the whole run while it lasts, and Python can interrupt neither from another
thread (nor can a watchdog: an exception it injects is raised only after the blocking call returns).
So each step of an episode (from one resumption of its coroutine to its next await, or its end) is
timed: a step that held the loop longer than `max_step_s` fails the episode as soon as it yields the
loop back (`LoopHeld`: scored 0, counted in episode_errors, its first occurrence shown), so the fault is
seen and named rather than only slowing the run. Blocking work belongs in a tool, which runs in a
thread under a timeout (docs/reliability.md, user code).
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Generator
from typing import Any

MAX_STEP_S = 2.0  # longest an episode may hold the loop between two awaits (our own work per step: milliseconds)


class LoopHeld(Exception):
    """An episode held the event loop longer than its step limit."""


async def timed_steps(awaitable: Awaitable[Any], max_step_s: float = MAX_STEP_S) -> Any:
    """Await `awaitable` (an episode's coroutine), failing it with LoopHeld after a step past `max_step_s`."""
    if not inspect.iscoroutine(awaitable):
        return await awaitable
    return await _Stepped(awaitable, max_step_s)


class _Stepped:
    def __init__(self, coro: Any, max_step_s: float) -> None:
        self.coro, self.max_step_s = coro, max_step_s

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, sent, error = self.coro, None, None
        while True:
            start = time.monotonic()
            try:
                yielded = coro.send(sent) if error is None else coro.throw(error)
            except StopIteration as stop:
                self._check(start)
                return stop.value
            self._check(start)
            try:
                sent, error = (yield yielded), None
            except BaseException as e:  # cancellation (the runner's timeout) and the like: the episode's to handle
                sent, error = None, e

    def _check(self, start: float) -> None:
        held = time.monotonic() - start
        if held > self.max_step_s:
            self.coro.close()
            raise LoopHeld(f"held the event loop for {held:.1f}s in one step (limit {self.max_step_s}s): an async "
                           f"episode must await, not block (time.sleep, a long computation); put blocking work in a "
                           f"tool")
