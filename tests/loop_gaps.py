"""The event loop's longest gap while some work runs: a ticker coroutine that wakes every 10 ms."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def with_longest_gap(work: Awaitable[T]) -> tuple[T, float]:
    """(what `work` returned, the longest seconds the loop went without running the ticker)."""
    gaps, stop = [0.0], asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    ticker = asyncio.create_task(tick())
    try:
        return await work, max(gaps)
    finally:
        stop.set()
        await ticker
