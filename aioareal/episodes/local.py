"""Episodes driven by an engine on the calling thread: evaluation and tests (training drives the
engine from `EpisodeWorker` (worker.py) instead, on the generator's thread).

`drive` runs on an event loop of its own (evaluation runs it with `asyncio.run` on the trainer's
thread): between engine steps the episodes run; while none of them needs the engine (all waiting
on tools) it waits for the next ask instead of spinning.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from ..generation import Engine
from .queue import TurnQueue


async def drive(engine: Engine, queue: TurnQueue, runs: list[Awaitable[Any]]) -> list[Any]:
    """Run `runs` (a runner's `run_group` calls) to their ends, stepping `engine` for their turns."""
    tasks = [asyncio.ensure_future(run) for run in runs]
    wake = asyncio.Event()
    queue.on_ask = lambda ask: wake.set()
    for task in tasks:
        task.add_done_callback(lambda _: wake.set())
    try:
        while not all(t.done() for t in tasks):
            queue.feed(engine.submit_turn)
            if engine.busy:
                engine.step()
                queue.resolve(engine.take_turns())
                await asyncio.sleep(0)  # the episodes whose turns ended go on
            else:
                wake.clear()
                await wake.wait()
        return [t.result() for t in tasks]
    finally:
        for task in tasks:
            task.cancel()
