"""What each rank's orchestrator does after a step under torchrun, around the run's own hooks.

`RankHooks.on_step` gathers every rank's report over the control group (on a thread of its own,
so the event loop and the generator keep going while a rank waits for the others), merges the rows
into the global one that rank 0 writes and shows, adds every rank's counters to the checkpoint
state, and settles a stop: a Ctrl-C or SIGTERM on any rank stops every rank after the same step. The
signal handler only notes the request (`request_stop`); the ranks act on it together here (`on_step`
returns the signal to every rank's orchestrator, which stops after that step), because a rank that
left the loop on its own while another started the next step would leave that one waiting in a
collective.

Each rank's rows become the run's global ones here too (`merge_rows` and its kin, below).
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import fmean
from typing import Any

from .. import checkpoint
from ..checkpoint import RunState
from ..checkpoint import sharded as dcp
from ..distributed.world import Mirror, World
from ..orchestrator import Hooks, StepReport

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
    """`events.checkpoint_saver` for several ranks: every rank writes its shards (on its trainer's
    thread, where every collective of the default group runs), rank 0 the rest."""
    async def save(state: RunState) -> None:
        rng = checkpoint.rng_state(engine_generator)  # read before anything awaits (see checkpoint_saver)
        trainer = trainer_worker.trainer
        await trainer_worker.call(dcp.save, run_dir, state, trainer, mirror, tokenizer, rng, keep, world)
    return save


# -- merge -------------------------------------------------------------------------------------------
# Each rank's step row and sample rows -> the run's global ones (rank 0 writes them).
#
# The trainer's figures (loss, grad norm, entropy, KL, train tokens, evaluation) are already global:
# `Trainer.summary` and the sharded evaluator reduce them over the ranks, so rank 0's value stands.
# What each rank measures alone is combined here, by the rule its meaning asks for.

# Throughput and counts add up over ranks (the ledger too: each rank admits and trains its own groups).
SUMMED = ("gen_tokens_per_s", "samples_per_s", "dropped_stale", "groups_admitted", "groups_trained",
          "groups_dropped_stale", "groups_rejected", "groups_in_flight", "groups_ready", "reward_failures")
# Per-sample averages: every rank trains B / N groups of G samples, so the global mean is the mean.
AVERAGED = ("reward_mean", "response_len_mean", "staleness_mean", "gen_idle_frac", "train_idle_frac")


def merge_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One metrics row from each rank's (rank order) for the same step."""
    merged = dict(rows[0])
    for key in SUMMED:
        if key in merged:
            merged[key] = sum(r[key] for r in rows)
    for key in AVERAGED:
        if key in merged:
            merged[key] = fmean(r[key] for r in rows)
    if "staleness_max" in merged:  # the bound is global: the stalest sample of any rank
        merged["staleness_max"] = max(r["staleness_max"] for r in rows)
    if "gen_version" in merged:  # the generator furthest behind
        merged["gen_version"] = min(r["gen_version"] for r in rows)
    if "reward_std" in merged:
        merged["reward_std"] = pooled_std([r["reward_mean"] for r in rows], [r["reward_std"] for r in rows])
    merged["time"] = max(r["time"] for r in rows)
    merged["world_size"] = len(rows)
    if "gen_idle_frac" in rows[0]:  # the dashboard shows each rank's busy share
        merged["gen_busy_ranks"] = [1.0 - r["gen_idle_frac"] for r in rows]
        merged["train_busy_ranks"] = [1.0 - r["train_idle_frac"] for r in rows]
    return merged


def pooled_std(means: list[float], stds: list[float]) -> float:
    """Population std of the union of equal-sized parts with these means and stds."""
    grand = fmean(means)
    return math.sqrt(max(0.0, fmean(s * s + m * m for m, s in zip(means, stds)) - grand * grand))


def merge_samples(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every rank's sample rows, each marked with its rank (group ids count per rank)."""
    return [{**row, "rank": rank} for rank, rows in enumerate(per_rank) for row in rows]
