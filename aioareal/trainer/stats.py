"""The step's statistics: per-token figures summed on the device over every micro-batch and update,
read back once per step (the step's one host sync) and turned into the metrics row's figures. Keys
ending in `_max` combine by max (over micro-batches, updates and ranks), all others by sum.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..distributed.world import Collective


@dataclass
class StepSums:
    """Per-token statistics summed on the device over a step, read back once in `read_back`."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    norms: list[torch.Tensor] = field(default_factory=list)
    updates: int = 0

    def add(self, stats: dict[str, torch.Tensor]) -> None:
        for key, value in stats.items():
            self.sums[key] = combine(key, self.sums.get(key), value)


def combine(key: str, old: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Step statistics add up over micro-batches and updates, except maxima (keys ending _max)."""
    if old is None:
        return new
    return torch.maximum(old, new) if key.endswith("_max") else old + new


def read_back(step: StepSums, collective: Collective) -> dict[str, float]:
    """Every figure of the step at once, over all ranks (sums summed, maxima maximised), plus
    `grad_norm`, the mean over updates of the gradient norm before clipping."""
    maxima = sorted(k for k in step.sums if k.endswith("_max"))
    summed = sorted(k for k in step.sums if not k.endswith("_max"))
    parts = [collective.sum_(torch.stack([step.sums[k] for k in summed]))]
    if maxima:
        parts.append(collective.max_(torch.stack([step.sums[k] for k in maxima])))
    parts.append(torch.stack(step.norms).float().mean()[None])
    # Intentional host sync, the step's only one besides the non-finite check per update.
    values = torch.cat(parts).tolist()
    return dict(zip(summed + maxima + ["grad_norm"], values))


def step_figures(total: dict[str, float], updates: int) -> dict[str, float]:
    """The metrics row's trainer figures: per-token means, the loss per optimizer update."""
    tokens = max(total["tokens"], 1.0)
    out = {
        "loss": total["loss"] / updates,  # mean over optimizer updates of the mini-batch loss
        "grad_norm": total["grad_norm"],
        "entropy": total["entropy"] / tokens,
        "clip_frac": total["clipped"] / tokens,
        "kl": total.get("kl", 0.0) / tokens,
        "behav_weight_mean": total["behav_weight"] / tokens,
        "behav_weight_max": total["behav_weight_max"],
        "behav_outside_clip_frac": total["behav_outside_clip"] / tokens,
        "stale_token_frac": total["stale_tokens"] / tokens,
        **gap_figures(total),
    }
    if "capped" in total:
        out["capped_frac"] = total["capped"] / tokens
        out["capped_neg_frac"] = total["capped_neg"] / tokens  # of those, advantage < 0
    if "dg_gate" in total:
        out["dg_gate_mean"] = total["dg_gate"] / tokens
    if "tis_capped" in total:
        out["tis_capped_frac"] = total["tis_capped"] / tokens
    return out


def gap_figures(total: dict[str, float]) -> dict[str, float]:
    """`logprob_gap_mean` and `_max` over the tokens the trainer's own version sampled; NaN if none."""
    fresh = total.get("logprob_gap_tokens", 0.0)
    if fresh == 0:
        return {"logprob_gap_mean": math.nan, "logprob_gap_max": math.nan}
    return {"logprob_gap_mean": total["logprob_gap"] / fresh, "logprob_gap_max": total["logprob_gap_max"]}
