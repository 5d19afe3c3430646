"""An asyncio event loop whose clock jumps to the next timer instead of sleeping.

Simulated workers `await asyncio.sleep(latency)`; under this loop a run of thousands of modelled
seconds takes milliseconds and is exactly reproducible, so tests can assert exact staleness bounds
and idle fractions of the real orchestrator code.
"""
from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):
        events = super().select(0)  # real descriptors (the loop's self-pipe) are only polled
        if events:
            return events
        if timeout is None:
            raise RuntimeError("virtual clock: every task is waiting and no timer is scheduled (deadlock)")
        self._loop._now += max(timeout, 0.0)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self._now


def run_virtual(coro: Coroutine[Any, Any, Any]) -> Any:
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
