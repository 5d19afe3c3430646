"""Loss math for the RL step: advantages, per-token objectives, KL, aggregation, grad clipping.

Pure functions of tensors (no model, no config), so each formula is unit-tested alone
(tests/trainer/test_losses.py). Shapes: N sequences x T token positions; `adv` is (N,) per sequence or
(N, T) per token. The objectives return *per-token* losses; `aggregate` reduces them with the
loss mask, so a caller can add a KL term per token first (docs/architecture.md rule 4).

Nothing here syncs with the host (.item(), bool(tensor)): branching is on Python values only,
and every data-dependent choice is a `torch.where`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean", "constant")
CAP_MODES = ("mask", "clamp")


def _per_token(adv: Tensor, like: Tensor) -> Tensor:
    """Broadcast per-sequence advantages (N,) over the tokens of `like` (N, T)."""
    return adv.unsqueeze(-1) if adv.dim() == like.dim() - 1 else adv


def group_advantages(rewards: Tensor, std_norm: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO advantages (DeepSeekMath, Shao et al. 2024, sec. 4.1.2): each reward minus its group's
    mean, optionally divided by the group's std. Dr. GRPO (Liu et al. 2025, arXiv 2503.20783)
    drops the std division (std_norm=False) because it up-weights near-constant groups.

    rewards: (groups, G) -> advantages (groups, G).
    """
    centred = rewards - rewards.mean(dim=-1, keepdim=True)
    # Unbiased std (Bessel), as TRL and verl compute it. A group of one has none (torch gives NaN
    # and warns); its centred reward is already exactly 0, so it is left undivided.
    if std_norm and rewards.shape[-1] > 1:
        centred = centred / (rewards.std(dim=-1, keepdim=True) + eps)
    # A constant group carries no learning signal; force exact zeros (the mean of identical floats
    # can be off by an ulp, which eps would then blow up).
    constant = rewards.amax(dim=-1, keepdim=True) == rewards.amin(dim=-1, keepdim=True)
    return torch.where(constant, torch.zeros_like(centred), centred)


def ppo_token_loss(logp: Tensor, behav_logp: Tensor, adv: Tensor, eps_low: float,
                   eps_high: float) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), per token, with asymmetric bounds
    (DAPO's "clip higher"): loss = -min(r A, clip(r, 1-eps_low, 1+eps_high) A), r = pi/pi_old.

    Returns (loss (N, T), clipped (N, T) bool): `clipped` marks tokens where the clipped branch is
    strictly smaller, i.e. where the gradient is zero.
    """
    adv = _per_token(adv, logp)
    ratio = torch.exp(logp - behav_logp)  # (N, T)
    unclipped = -ratio * adv
    clipped_loss = -ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    # -min(a, b) == max(-a, -b); ties go to the unclipped branch, which keeps the gradient.
    return torch.maximum(unclipped, clipped_loss), clipped_loss > unclipped


def decoupled_token_loss(logp: Tensor, prox_logp: Tensor, behav_logp: Tensor, adv: Tensor,
                         eps_low: float, eps_high: float, behav_cap: float = 5.0,
                         cap_mode: str = "mask") -> tuple[Tensor, Tensor, Tensor]:
    """Decoupled PPO (AReaL, Fu et al. 2025, arXiv 2505.24298, eq. 5): the trust region is
    centred on the proximal policy pi_prox, and the off-policy gap pi_prox / pi_behav enters as
    an importance weight w without gradient:
        loss = -w * min(u A, clip(u, 1-eps_low, 1+eps_high) A),  u = pi / pi_prox.
    Stale tokens can make w explode; tokens with w > behav_cap are masked out ("mask") or their
    weight is clamped to behav_cap ("clamp").

    Returns (loss (N, T), clipped (N, T) bool, capped (N, T) bool: w over the cap).
    """
    if cap_mode not in CAP_MODES:
        raise ValueError(f"cap_mode must be one of {CAP_MODES}, got {cap_mode!r}")
    prox_logp = prox_logp.detach()
    w = torch.exp(prox_logp - behav_logp.detach())  # (N, T)
    capped = w > behav_cap
    if cap_mode == "mask":
        w = torch.where(capped, torch.zeros_like(w), w)
    else:
        w = w.clamp(max=behav_cap)
    surrogate, clipped = ppo_token_loss(logp, prox_logp, adv, eps_low, eps_high)
    return w * surrogate, clipped, capped


def tis_weight(old_logp: Tensor, behav_logp: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings
    you off-policy RL training"): the engine samples with log-probs log pi_behav that differ from the
    trainer's log pi_old for the same weights (bf16 generator, other kernels); the per-token weight
    min(pi_old / pi_behav, cap), without gradient, corrects for that mismatch and bounds its variance.

    old_logp, behav_logp: (N, T) -> weights (N, T), detached."""
    return torch.exp(old_logp.detach() - behav_logp.detach()).clamp(max=cap)


def tis_behaviour_logp(old_logp: Tensor, behav_logp: Tensor, cap: float) -> Tensor:
    """The behaviour log-probs PPO's ratio divides by under truncated importance sampling. The ratio
    pi / pi_behav factors as (pi / pi_old) * (pi_old / pi_behav); truncating the second factor at
    `cap` gives r = (pi / pi_old) * min(pi_old / pi_behav, cap), i.e. the denominator
    log pi_behav' = max(log pi_behav, log pi_old - log cap). cap = inf returns `behav_logp` itself.

    old_logp, behav_logp: (N, T) -> (N, T), detached."""
    floor = old_logp.detach() - math.log(cap)  # -inf when cap = inf
    return torch.maximum(behav_logp.detach(), floor)


def dg_token_loss(logp: Tensor, adv: Tensor, eta: float = 1.0) -> tuple[Tensor, Tensor]:
    """Delightful Policy Gradient (Osband 2026, arXiv 2603.14608): gate each token's policy-gradient
    term by its "delight" chi = A * l, the advantage times the surprisal l = -log pi(a):
        w = sigmoid(chi / eta),  loss = -sg(w A) log pi(a).
    Surprising successes (A > 0, large l) pass with w -> 1; surprising failures are damped. No
    ratios and no behaviour probabilities, so stale samples need no correction.

    Returns (loss (N, T), gate w (N, T), detached).
    """
    adv = _per_token(adv, logp)
    surprisal = -logp.detach()
    gate = torch.sigmoid(adv * surprisal / eta)
    return -(gate * adv).detach() * logp, gate


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate, Schulman's k3 (http://joschu.net/blog/kl-approx.html),
    as GRPO uses it (DeepSeekMath eq. 4): with d = log pi_ref - log pi on tokens sampled from pi,
    k3 = exp(d) - d - 1, unbiased and >= 0 per token. expm1 keeps precision when d is tiny."""
    d = ref_logp - logp
    return torch.expm1(d) - d


def aggregate(per_token: Tensor, mask: Tensor, mode: str, total_tokens: float | None = None,
              total_seqs: float | None = None, constant: float | None = None) -> Tensor:
    """Reduce (N, T) per-token losses over a (N, T) 0/1 mask to a scalar.

    - "token-mean": every token of the mini-batch weighs the same (DAPO).
    - "seq-mean":   mean over each sequence's tokens, then over sequences (original GRPO).
    - "constant":   sum over tokens / (sequences * constant), constant = max new tokens
                    (Dr. GRPO, arXiv 2503.20783, sec. 3.1: no length bias).
    The totals default to this batch's own; pass the mini-batch's totals so that the losses of its
    micro-batches add up to the mini-batch loss (gradient accumulation without rescaling).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {AGG_MODES}")
    mask = mask.to(per_token.dtype)
    masked = per_token * mask  # (N, T)
    seqs = float(per_token.shape[0]) if total_seqs is None else total_seqs
    if mode == "token-mean":
        # Default clamps at 1 so an all-masked batch gives 0, not NaN.
        tokens = mask.sum().clamp(min=1.0) if total_tokens is None else total_tokens
        return masked.sum() / tokens
    if mode == "seq-mean":
        per_seq = masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)  # (N,)
        return per_seq.sum() / seqs
    if constant is None:
        raise ValueError("loss aggregation 'constant' needs `constant` (the max new tokens)")
    return masked.sum() / (seqs * constant)


def grad_norm_clip(parameters: Iterable[Tensor] | Tensor, max_norm: float) -> Tensor:
    """Total L2 norm of the gradients before clipping, as a tensor (no host sync); scales them in
    place to `max_norm` when it is > 0. 0 disables clipping (clip_grad_norm_ would zero every
    gradient), but the norm is still returned for the metrics and the non-finite check."""
    limit = max_norm if max_norm > 0 else float("inf")
    # foreach=None: the fused multi-tensor kernels wherever the device supports them.
    return torch.nn.utils.clip_grad_norm_(parameters, limit, foreach=None)
