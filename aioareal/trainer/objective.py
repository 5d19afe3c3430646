"""The per-micro-batch objective: ppo | decoupled | dg, plus the k3 KL penalty (DESIGN rule 4).

Loss math lives in `aioareal.losses` as pure functions; this module only picks and wires them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import losses
from ..config import AlgoConfig
from .batching import MicroBatch


@dataclass
class Totals:
    """Normalisers of one mini-batch, so micro-batch losses sum to the mini-batch loss."""

    tokens: float
    seqs: float
    constant: float  # Dr. GRPO's fixed length (generation.max_new_tokens)


def loglinear_prox(logp: torch.Tensor, behav_logp: torch.Tensor, token_versions: torch.Tensor,
                   prox_version: float, theta_version: float) -> torch.Tensor:
    """Approximate log pi_prox without a forward pass by interpolating in log space between the
    behaviour policy (version v_b, per token) and the current one (v_theta), at v_prox:
    log pi_prox = log pi_b + alpha (log pi_theta - log pi_b), alpha = (v_prox - v_b) / (v_theta - v_b).
    Exact at both ends: fresh tokens (v_b = v_prox) give pi_b, and v_theta = v_prox gives pi_theta."""
    span = theta_version - token_versions
    alpha = torch.where(span > 0, (prox_version - token_versions) / span.clamp(min=1e-6), torch.ones_like(span))
    return (behav_logp + alpha.clamp(0, 1) * (logp.detach() - behav_logp)).detach()


def behaviour_stats(cfg: AlgoConfig, mb: MicroBatch, logp: torch.Tensor,
                    prox_version: float) -> dict[str, torch.Tensor]:
    """How far the trained policy is from the one that sampled the tokens, summed over loss tokens
    (keys ending in `_max` are maxima). `logp` is the policy the objective weighs the behaviour
    against: pi_prox for decoupled (w = pi_prox / pi_behav, the weight it applies and caps), the
    current policy for ppo (its ratio) and dg (which ignores it: measured only, to compare).
    Staleness alone does not say how much the objective's correction matters; these do."""
    mask = mb.loss_mask
    w = torch.exp(logp.detach() - mb.behav_logp)  # (N, T)
    # Outside PPO's trust region around the behaviour policy: where a behaviour-centred clip can act.
    outside = (w < 1.0 - cfg.clip_eps_low) | (w > 1.0 + cfg.clip_eps_high)
    return {"behav_weight": (w * mask).sum(),
            "behav_weight_max": torch.where(mask, w, torch.zeros_like(w)).amax(),
            "behav_outside_clip": (outside & mask).sum(),
            # Sampled by a version older than the trainer's at the start of this step.
            "stale_tokens": ((mb.versions < prox_version) & mask).sum()}


def micro_loss(cfg: AlgoConfig, mb: MicroBatch, logp: torch.Tensor, totals: Totals,
               prox_version: float, theta_version: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar loss (already normalised by the mini-batch totals) and summed per-token stats."""
    mask, adv = mb.loss_mask, mb.advantages
    prox = None
    if cfg.objective == "decoupled":
        prox = mb.prox_logp if mb.prox_logp is not None else loglinear_prox(
            logp, mb.behav_logp, mb.versions, prox_version, theta_version)
    stats = behaviour_stats(cfg, mb, logp if prox is None else prox, prox_version)
    if cfg.objective == "ppo":
        per_token, clipped = losses.ppo_token_loss(logp, mb.behav_logp, adv, cfg.clip_eps_low, cfg.clip_eps_high)
    elif prox is not None:
        per_token, clipped, capped = losses.decoupled_token_loss(
            logp, prox, mb.behav_logp, adv, cfg.clip_eps_low, cfg.clip_eps_high, cfg.behav_cap, cfg.behav_cap_mode)
        stats["capped"] = (capped & mask).sum()
        # Masking a capped token with A < 0 drops the correction of a bad token the policy has since
        # made more likely; with A > 0 it only stops pushing an already-learned one (like PPO's clip).
        negative = (adv if adv.dim() == logp.dim() else adv.unsqueeze(-1)) < 0  # (N, T) or (N, 1)
        stats["capped_neg"] = (capped & mask & negative).sum()
    else:
        per_token, gate = losses.dg_token_loss(logp, adv, cfg.dg_eta)
        clipped = torch.zeros_like(mask)
        stats["dg_gate"] = (gate.detach() * mask).sum()
    stats["clipped"] = (clipped & mask).sum()
    if cfg.kl_coef > 0:
        kl = losses.k3_kl(logp, mb.ref_logp)
        stats["kl"] = (kl.detach() * mask).sum()
        per_token = per_token + cfg.kl_coef * kl
    loss = losses.aggregate(per_token, mask.to(per_token.dtype), cfg.loss_agg, totals.tokens, totals.seqs,
                            totals.constant)
    return loss, stats
