"""Stop signals (run/events.py): the first asks the run to finish its step; a second, later one
exits at once; the same signal delivered twice at once (GNU `timeout` signals the process and its
group) is one request, not a second Ctrl-C."""
from __future__ import annotations

import asyncio
import os
import signal

from aioareal.run import events


class Target:
    def __init__(self) -> None:
        self.stop_requested = False
        self.requests: list[int] = []

    def request_stop(self, signum: int = 2) -> None:
        self.stop_requested = True
        self.requests.append(signum)


def test_a_signal_delivered_twice_at_once_is_one_request_and_a_later_one_exits(monkeypatch):
    exits: list[int] = []
    monkeypatch.setattr(events.os, "_exit", exits.append)
    target = Target()

    async def run() -> None:
        with events.stop_signals(target):
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # handled in the same loop turn as the first
            await asyncio.sleep(0.05)
            assert target.requests == [signal.SIGTERM] and exits == []
            await asyncio.sleep(2 * events.DUPLICATE_S)
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(0.05)

    asyncio.run(run())
    assert exits == [128 + signal.SIGTERM]  # (the patched exit returns, so the handler went on past it)
