"""What one training step writes to metrics.jsonl and samples.jsonl (names are a public contract:
the plot, report and dashboard commands read them)."""
from __future__ import annotations

from statistics import fmean, pstdev
from typing import TYPE_CHECKING, Any

from ..samples import Group

if TYPE_CHECKING:
    from .loop import Orchestrator


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def step_row(o: "Orchestrator", step: int, trained_version: int, groups: list[Group], dropped: int,
             metrics: dict[str, float], train_seconds: float, last: dict[str, float]) -> dict[str, Any]:
    """Metrics of one step; `last` holds the previous row's clocks and is advanced here."""
    now = o.now()
    wall = now - last["time"]
    samples = [s for g in groups for s in g.samples]
    staleness = [s.staleness(trained_version) for s in samples]
    rewards = [s.reward for s in samples]
    tokens = o.gen.tokens_generated
    row = {
        "step": step,
        "version": o.train.version,
        "gen_version": o.gen.version,
        "time": now,
        "reward_mean": fmean(rewards),
        "reward_std": pstdev(rewards),
        "response_len_mean": fmean(len(s.tokens) for s in samples),
        "staleness_mean": fmean(staleness),
        "staleness_max": max(staleness),
        "dropped_stale": dropped,
        # Engine speed: tokens per second of generator busy time (wall-clock rates would mix in
        # whatever else the interval held, such as an evaluation overlapping generation).
        "gen_tokens_per_s": _ratio(tokens - last["tokens"], o.busy["gen"] - last["gen_busy"]),
        "train_tokens_per_s": _ratio(metrics.get("train_tokens", 0), train_seconds),
        "samples_per_s": _ratio(len(samples), wall),
        "gen_idle_frac": max(0.0, 1.0 - _ratio(o.busy["gen"] - last["gen_busy"], wall)),
        "train_idle_frac": max(0.0, 1.0 - _ratio(o.busy["train"] - last["train_busy"], wall)),
        "groups_admitted": o.ledger.admitted,
        "groups_trained": o.ledger.trained,
        "groups_dropped_stale": o.ledger.dropped_stale,
        "groups_rejected": o.ledger.rejected,
        "groups_in_flight": o.ledger.in_flight,
        "groups_ready": o.buffer.ready(),
        "reward_failures": o.reward_failures,
        **metrics,
    }
    last.update(time=now, gen_busy=o.busy["gen"], train_busy=o.busy["train"], tokens=tokens)
    return row


def sample_rows(step: int, trained_version: int, groups: list[Group], now: float) -> list[dict[str, Any]]:
    return [{
        "step": step,
        "group_id": g.group_id,
        "version_min": s.version_min,
        "version_max": s.version_max,
        "staleness": s.staleness(trained_version),
        "reward": s.reward,
        "advantage": s.advantage,
        "length": len(s.tokens),
        "finish_reason": s.completion.finish_reason,
        "admitted_at": g.admitted_at,
        "finished_at": g.finished_at,
        "trained_at": now,
    } for g in groups for s in g.samples]
