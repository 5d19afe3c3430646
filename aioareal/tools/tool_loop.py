"""An event loop in a daemon thread of its own, where `async def` tools run (tools/toolbox.py).

Why not the run's loop: a coroutine runs there until it awaits, so a tool that blocks inside (a
synchronous sleep, a long computation) would freeze the whole run, and no timeout can fire while it
does. Here it freezes only this loop: the run's loop enforces each call's timeout (the call fails,
counted), and a loop that has not run its heartbeat for much of that timeout is stuck: it is retired
(later calls go to a fresh loop), and it stops once its tool returns and its other calls have ended.
One loop shared by all calls rather than one per call: async tools stay cheap to run by the hundred,
and a client a tool keeps between calls (an HTTP session) stays on the loop it was made on.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

HEARTBEAT_S = 0.05  # how often the loop says it is alive; a stuck loop is noticed this late at worst


class ToolLoop:
    def __init__(self, name: str = "tool-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._beat = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def held_for(self) -> float:
        """Seconds since the loop last ran its heartbeat: how long a tool has held it, roughly."""
        return time.monotonic() - self._beat

    def submit(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Future:
        """Run the coroutine `make()` on this loop; cancelling the future cancels it there."""
        async def run() -> Any:
            return await make()
        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def blocked(self, timeout_s: float) -> bool:
        """Whether a tool holds the loop: it has not run its heartbeat for a good part of a call's timeout."""
        return self.held_for() > max(2 * HEARTBEAT_S, timeout_s / 2)

    def retire(self) -> None:
        """Take no more calls; once the loop runs again (a stuck one: when its tool returns) and the calls
        still on it have ended, it stops and its thread ends."""
        self.loop.call_soon_threadsafe(self._stop_when_idle)

    def _stop_when_idle(self) -> None:
        if any(not task.done() for task in asyncio.all_tasks(self.loop)):
            self.loop.call_later(HEARTBEAT_S, self._stop_when_idle)
        else:
            self.loop.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _tick(self) -> None:
        self._beat = time.monotonic()
        self.loop.call_later(HEARTBEAT_S, self._tick)
