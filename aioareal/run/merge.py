"""Each rank's step row and sample rows -> the run's global ones (rank 0 writes them).

The trainer's figures (loss, grad norm, entropy, KL, train tokens, evaluation) are already global:
`Trainer.summary` and the sharded evaluator reduce them over the ranks, so rank 0's value stands.
What each rank measures alone is combined here, by the rule its meaning asks for."""
from __future__ import annotations

import math
from statistics import fmean
from typing import Any

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
