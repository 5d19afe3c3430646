"""The per-micro-batch objective: ppo | decoupled | dg, optional truncated importance sampling
(algo.tis_cap), the k3 KL penalty (docs/architecture.md rule 4), and each micro-batch's statistics.
The loss math is `aioareal.losses`' pure functions; this picks and wires them. Supervised
fine-tuning's loss is here too (`completion_loss`).

The step's statistics: per-token figures summed on the device over every micro-batch and update,
read back once per step (the step's one host sync) and turned into the metrics row's figures. Keys
ending in `_max` combine by max (over micro-batches, updates and ranks), all others by sum.

Samples of zero advantage carry no gradient: with train.skip_zero_advantage `set_aside` keeps them
out of the computed micro-batches, while they still count in the loss's normalisers (`Totals`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import losses
from ..config import AlgoConfig
from ..distributed.world import Collective
from ..group import Sample
from .batching import MicroBatch
from .logprobs import token_logprobs

# -- zero-advantage samples, set aside ------------------------------------------------------------------
# A sample of advantage exactly zero adds exactly zero to every objective's gradient (unless a KL
# penalty pulls it), and GRPO gives many (every group whose rewards are all equal). They are set aside
# and only counted in the loss's normalisers, so the update is the whole mini-batch's. One sample of
# each mini-batch is always computed, so every parameter gets a (zero) gradient: AdamW moves on its
# moments even at a zero gradient, and skips a parameter that has none.

@dataclass
class SetAside:
    """What a mini-batch left out: counted in its loss's normalisers, computed nowhere."""

    rows: int = 0
    completion_tokens: int = 0  # tokens a loss term would have covered (an episode's model tokens)


def set_aside(samples: list[Sample], enabled: bool) -> tuple[list[Sample], SetAside]:
    """The samples to compute, and the counts of those left out; keeps one (the shortest) at least."""
    if not enabled:
        return samples, SetAside()
    keep = [s for s in samples if s.advantage != 0.0]
    if not keep:
        keep = [min(samples, key=lambda s: len(s.prompt_ids) + len(s.tokens))]
    kept = {id(s) for s in keep}
    left = [s for s in samples if id(s) not in kept]
    return keep, SetAside(len(left), sum(loss_tokens(s) for s in left))


def loss_tokens(sample: Sample) -> int:
    """The sample's tokens a loss term covers: its model's tokens (not an episode's observations)."""
    mask = sample.completion.model_mask()
    return len(sample.tokens) if mask is None else sum(mask)


@dataclass
class Totals:
    """Normalisers of one mini-batch, so micro-batch losses sum to the mini-batch loss."""

    tokens: float
    seqs: float
    constant: float  # Dr. GRPO's fixed length (generation.max_new_tokens)


def loglinear_prox(logp: torch.Tensor, behav_logp: torch.Tensor, token_versions: torch.Tensor,
                   prox_version: float, theta_version: float) -> torch.Tensor:
    """log pi_prox without a forward pass, interpolated in log space between the behaviour policy
    (version v_b, per token) and the current one: log pi_b + alpha (log pi_theta - log pi_b),
    alpha = (v_prox - v_b) / (v_theta - v_b); exact at both ends. At a step's first update (theta is
    still the step's start) it is log pi_theta itself, which is also what a recomputing forward would give."""
    if theta_version == prox_version:
        return logp.detach()
    span = theta_version - token_versions
    alpha = torch.where(span > 0, (prox_version - token_versions) / span.clamp(min=1e-6), torch.ones_like(span))
    return (behav_logp + alpha.clamp(0, 1) * (logp.detach() - behav_logp)).detach()


def behaviour_stats(cfg: AlgoConfig, mb: MicroBatch, logp: torch.Tensor,
                    prox_version: float) -> dict[str, torch.Tensor]:
    """How far the trained policy is from the one that sampled the tokens, summed over loss tokens
    (`_max` keys are maxima). `logp` is what the objective weighs the behaviour against: pi_prox for
    decoupled, the current policy for ppo and dg (for dg measured only, to compare)."""
    mask = mb.loss_mask
    w = torch.exp(logp.detach() - mb.behav_logp)  # (N, T)
    # Outside PPO's trust region around the behaviour policy: where a behaviour-centred clip can act.
    outside = (w < 1.0 - cfg.clip_eps_low) | (w > 1.0 + cfg.clip_eps_high)
    return {"behav_weight": (w * mask).sum(),
            "behav_weight_max": torch.where(mask, w, torch.zeros_like(w)).amax(),
            "behav_outside_clip": (outside & mask).sum(),
            # Sampled by a version older than the trainer's at the start of this step.
            "stale_tokens": ((mb.versions < prox_version) & mask).sum()}


def gap_stats(mb: MicroBatch, trainer_logp: torch.Tensor, version: float) -> dict[str, torch.Tensor]:
    """Engine/trainer agreement: |log pi_trainer - log pi_behav| summed, counted and maximised over
    the loss tokens sampled by the trainer's own `version` (on others it measures staleness). Its
    silent growth (a bf16 generator against an fp32 trainer) is what collapses runs."""
    fresh = mb.loss_mask & (mb.versions == version)  # (N, T)
    gap = torch.where(fresh, (trainer_logp.detach() - mb.behav_logp).abs(), torch.zeros_like(mb.behav_logp))
    return {"logprob_gap": gap.sum(), "logprob_gap_tokens": fresh.sum(), "logprob_gap_max": gap.amax()}


def start_logp(mb: MicroBatch, logp: torch.Tensor, first_update: bool) -> torch.Tensor | None:
    """The trainer's log-probs at the start of the step (no grad), where this micro-batch has them:
    recomputed before the update, or this very forward before any update (for ppo/dg with several
    mini-batches the gap is measured on the first alone, rather than pay a forward for it)."""
    if mb.prox_logp is not None:
        return mb.prox_logp
    return logp.detach() if first_update else None


def policy_loss(cfg: AlgoConfig, mb: MicroBatch, logp: torch.Tensor, prox: torch.Tensor | None,
                old: torch.Tensor | None, stats: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss (N, T) and clipped tokens (N, T) of the configured objective; adds its own
    statistics to `stats`. With algo.tis_cap (ppo and dg; the config refuses it for decoupled,
    whose weight pi_prox / pi_behav already corrects the mismatch), `old` = start_logp:
      ppo: ratio (pi / pi_old) * min(pi_old / pi_behav, C), clipped as PPO's (C = inf: plain ppo);
      dg:  DG's per-token loss times min(pi_old / pi_behav, C) (C = inf: full importance weight)."""
    mask, adv, tis = mb.loss_mask, mb.advantages, cfg.tis_cap
    if tis is not None:
        if old is None:
            raise ValueError("algo.tis_cap needs the trainer's log-probs at the step's start (fill_fixed_logprobs)")
        stats["tis_capped"] = ((torch.exp(old - mb.behav_logp) > tis) & mask).sum()
    if cfg.objective == "ppo":
        behav = mb.behav_logp if tis is None else losses.tis_behaviour_logp(old, mb.behav_logp, tis)
        return losses.ppo_token_loss(logp, behav, adv, cfg.clip_eps_low, cfg.clip_eps_high)
    if prox is not None:
        per_token, clipped, capped = losses.decoupled_token_loss(
            logp, prox, mb.behav_logp, adv, cfg.clip_eps_low, cfg.clip_eps_high, cfg.behav_cap, cfg.behav_cap_mode)
        stats["capped"] = (capped & mask).sum()
        # Masking a capped token with A < 0 drops the correction of a bad token the policy has since
        # made more likely; with A > 0 it only stops pushing an already-learned one (like PPO's clip).
        negative = (adv if adv.dim() == logp.dim() else adv.unsqueeze(-1)) < 0  # (N, T) or (N, 1)
        stats["capped_neg"] = (capped & mask & negative).sum()
        return per_token, clipped
    per_token, gate = losses.dg_token_loss(logp, adv, cfg.dg_eta)
    stats["dg_gate"] = (gate.detach() * mask).sum()
    if tis is not None:
        per_token = per_token * losses.tis_weight(old, mb.behav_logp, tis)
    return per_token, torch.zeros_like(mask)


def micro_loss(cfg: AlgoConfig, mb: MicroBatch, logp: torch.Tensor, totals: Totals,
               prox_version: float, theta_version: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar loss (already normalised by the mini-batch totals) and summed per-token stats."""
    mask = mb.loss_mask
    prox = None
    if cfg.objective == "decoupled":
        prox = mb.prox_logp if mb.prox_logp is not None else loglinear_prox(
            logp, mb.behav_logp, mb.versions, prox_version, theta_version)
    stats = behaviour_stats(cfg, mb, logp if prox is None else prox, prox_version)
    # The first update of the step sees the weights of its start (the policy's version is the trainer's).
    old = start_logp(mb, logp, first_update=theta_version == prox_version)
    if old is not None:  # decoupled recomputed: every update; the mean and max are the same over epochs
        stats.update(gap_stats(mb, old, prox_version))
    per_token, clipped = policy_loss(cfg, mb, logp, prox, old, stats)
    stats["clipped"] = (clipped & mask).sum()
    if cfg.kl_coef > 0:
        kl = losses.k3_kl(logp, mb.ref_logp)
        stats["kl"] = (kl.detach() * mask).sum()
        per_token = per_token + cfg.kl_coef * kl
    loss = losses.aggregate(per_token, mask.to(per_token.dtype), cfg.loss_agg, totals.tokens, totals.seqs,
                            totals.constant)
    return loss, stats


# -- supervised --------------------------------------------------------------------------------------
# The loss of `sft` (run/sft.py) and the warm-start (run/warmup.py): next-token loss on the completion only.

# Above this many logits (1 GiB in fp32) the loss takes the chunked head (a 262k vocabulary never
# holds them all); below, the plain forward's.
FULL_LOGITS = 1 << 28


@dataclass
class Demo:
    prompt: list[int]
    completion: list[int]  # ends in EOS
    taught: list[bool] | None = None  # per completion token, whether it is a target (a tool's result is not)


def completion_loss(model: Any, demos: list[Demo], device: torch.device) -> tuple[torch.Tensor, int]:
    """The summed negative log-likelihood of the completions' taught tokens, and how many there are."""
    rows = [d.prompt + d.completion for d in demos]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.zeros(len(rows), width - 1, dtype=torch.bool)  # position t predicts token t + 1
    for i, (d, row) in enumerate(zip(demos, rows)):
        ids[i, :len(row)] = torch.tensor(row)
        attention[i, :len(row)] = 1
        targets[i, len(d.prompt) - 1:len(row) - 1] = True if d.taught is None else torch.tensor(d.taught)
    ids, attention, targets = ids.to(device), attention.to(device), targets.to(device)
    if ids.numel() * model.config.vocab_size > FULL_LOGITS:  # a 262k vocabulary: the head in chunks
        logp, _ = token_logprobs(model, ids, attention, targets)
        return -logp.sum(), int(targets.sum())
    # Right padding after every row's tokens cannot reach them through causal attention: no mask.
    logits = model(ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return -(logp * targets).sum(), int(targets.sum())


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
