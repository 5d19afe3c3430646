"""What each rank's orchestrator does after a step under torchrun, around the run's own hooks.

`RankHooks.on_step` gathers every rank's report over the control group (on a thread of its own,
so the event loop and the generator keep going while a rank waits for the others), merges the rows
into the global one that rank 0 writes and shows, adds every rank's counters to the checkpoint
state, and settles a stop: a Ctrl-C or SIGTERM on any rank stops every rank after the same step. The
signal handler only notes the request (`request_stop`); the ranks act on it together here (`on_step`
returns the signal to every rank's orchestrator, which stops after that step), because a rank that
left the loop on its own while another started the next step would leave that one waiting in a
collective.
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import checkpoint
from ..checkpoint import RunState
from ..checkpoint import sharded as dcp
from ..distributed.sharding import Mirror
from ..distributed.world import World
from ..orchestrator import Hooks, StepReport
from .merge import merge_rows, merge_samples

COUNTERS = ("cursor", "ledger", "reward_failures")  # what each rank's checkpoint state holds of its own


class RankHooks:
    def __init__(self, inner: Hooks, world: World) -> None:
        self.inner, self.world = inner, world
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="control")
        self.signal: int | None = None  # a stop asked on this rank, not yet acted on

    @property
    def stop_requested(self) -> bool:
        return self.signal is not None

    def request_stop(self, signum: int = 2) -> None:
        self.signal = signum

    async def _gather(self, payload: Any) -> list[Any]:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.world.all_gather, payload)

    def _with_ranks(self, state: RunState, states: list[dict[str, Any]]) -> RunState:
        return dataclasses.replace(state, ranks=[{k: s[k] for k in COUNTERS} for s in states])

    async def on_step(self, report: StepReport) -> int | None:
        """Returns the stop signal of the first rank that was asked to stop (the same on every rank)."""
        gathered = await self._gather((report.row, report.samples, dataclasses.asdict(report.state), self.signal))
        signals = [g[3] for g in gathered if g[3] is not None]
        rows, samples, states = [g[0] for g in gathered], [g[1] for g in gathered], [g[2] for g in gathered]
        merged = StepReport(report.step, merge_rows(rows), merge_samples(samples), report.groups,
                            self._with_ranks(report.state, states))
        await self.inner.on_step(merged)
        return signals[0] if signals else None

    async def on_stop(self, state: RunState) -> None:
        states = await self._gather(dataclasses.asdict(state))
        await self.inner.on_stop(self._with_ranks(state, states))

    def close(self) -> None:
        self.pool.shutdown(wait=False)


def sharded_saver(run_dir: Path, trainer_worker: Any, engine_generator: Any, mirror: Mirror, tokenizer: Any,
                  keep: int, world: World) -> Callable[[RunState], Any]:
    """`hooks.checkpoint_saver` for several ranks: every rank writes its shards (on its trainer's
    thread, where every collective of the default group runs), rank 0 the rest."""
    async def save(state: RunState) -> None:
        rng = checkpoint.rng_state(engine_generator)  # read before anything awaits (see checkpoint_saver)
        trainer = trainer_worker.trainer
        await trainer_worker.call(dcp.save, run_dir, state, trainer, mirror, tokenizer, rng, keep, world)
    return save
