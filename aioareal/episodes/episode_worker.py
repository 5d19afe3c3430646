"""The generator for episodes in training (docs/episodes.md#the-engine-serves-turns): the engine's
worker thread, driven by the turns episodes ask for, under the GenerationWorker contract (a group is
G episodes of one example, handed back when the last has returned).

`step` hands the episodes' asks to the engine between two engine steps, runs one, and wakes the
episodes whose turns ended. While every episode waits on the world, `busy` is False and the
orchestrator waits for `on_work` instead of spinning. Episodes that have not asked for their first
turn hold their group's places (`free_slots`), so async admission does not over-admit.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..generation import Engine
from ..group import Group
from .handle import Ask, TurnQueue
from .runner import EpisodeRunner


class EngineSide(Protocol):
    """What the worker drives: the orchestrator's `EngineWorker`, one step at a time on its thread."""

    engine: Any

    @property
    def version(self) -> int: ...
    @property
    def tokens_generated(self) -> int: ...
    @property
    def phase_seconds(self) -> dict[str, float]: ...

    def free_slots(self) -> int: ...
    async def step(self, adopt: bool) -> list[Group]: ...
    def close(self) -> None: ...


class EpisodeWorker:
    def __init__(self, inner: EngineSide, runner: EpisodeRunner, queue: TurnQueue) -> None:
        self.inner, self.runner, self.queue = inner, runner, queue
        self.engine = inner.engine
        self.active: dict[int, asyncio.Task] = {}  # group id -> its episodes
        self.groups: dict[int, Group] = {}
        self.done: list[Group] = []  # finished groups not yet handed back
        self.unasked: dict[int, int] = {}  # group id -> its episodes that have not asked for a turn yet
        self._wake: Callable[[], None] = lambda: None
        queue.on_ask = self._on_ask

    # -- the GenerationWorker contract -----------------------------------------------------------
    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def tokens_generated(self) -> int:
        return self.inner.tokens_generated

    @property
    def phase_seconds(self) -> dict[str, float]:
        return self.inner.phase_seconds

    def on_work(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def submit(self, group: Group) -> None:
        self.groups[group.group_id] = group
        self.unasked[group.group_id] = group.size
        task = asyncio.get_running_loop().create_task(self._run(group), name=f"episodes-{group.group_id}")
        self.active[group.group_id] = task

    def free_slots(self) -> int:
        return self.inner.free_slots() - self.queue.pending_sequences - sum(self.unasked.values())

    @property
    def busy(self) -> bool:
        return bool(self.done or self.queue.pending or self.engine.busy)

    @property
    def in_flight(self) -> int:
        # From an episode's first model token: counting one that has only observed would keep sync
        # from ever adopting a new version when every episode observes first.
        return len(self.engine.running) + sum(1 for g in self.groups.values() for s in g.samples
                                              if len(s.tokens) > s.completion.obs_tokens)

    async def step(self, adopt: bool) -> list[Group]:
        self.queue.feed(self.engine.submit_turn)
        if self.engine.busy:
            # The turns are read on the loop's thread once the engine's has returned: no step runs now.
            await self.inner.step(adopt)
            self.queue.resolve(self.engine.take_turns())
        done, self.done = self.done, []
        return done

    # -- episodes ----------------------------------------------------------------------------------
    async def _run(self, group: Group) -> None:
        try:
            _, failures = await self.runner.run_group(group)  # the rewards are on the group already
            group.reward_failures = failures
        finally:
            self.active.pop(group.group_id, None)
            self.groups.pop(group.group_id, None)
            self.unasked.pop(group.group_id, None)
        self.done.append(group)
        self._wake()

    def _on_ask(self, ask: Ask) -> None:
        if ask.first and ask.group.group_id in self.unasked:  # its place turns into a pending ask
            self.unasked[ask.group.group_id] -= 1
        self._wake()

    def counters(self) -> dict[str, float]:
        """Cumulative episode and tool counts for the metrics row."""
        return {**self.runner.stats.metrics(), **self.runner.ctx.tools.stats.metrics()}

    def close(self) -> None:
        for task in self.active.values():
            task.cancel()
        self.inner.close()


async def stored_rewards(group: Group) -> tuple[list[float], int]:
    """The orchestrator's scorer for episodes: they have scored themselves (runner.run_group)."""
    return group.rewards, group.reward_failures


# -- episodes on the calling thread ------------------------------------------------------------------
# Evaluation and tests step an engine on the calling thread, under an event loop of their own; while
# no episode needs the engine, `drive` waits for the next ask instead of spinning.
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
