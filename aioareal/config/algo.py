"""`algo`: the RL objective and its optimizer settings (one section of the typed config, schema.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .fields import check, doc


@dataclass
class AlgoConfig:
    objective: Literal["ppo", "decoupled", "dg"] = doc("ppo | decoupled (AReaL) | dg (Delightful PG)", "ppo")
    group_size: int = doc("samples per prompt (G)", 8)
    batch_groups: int = doc("prompt groups per training step (B)", 32)
    minibatches: int = doc("optimizer steps per training step (PPO mini-batches)", 1)
    ppo_epochs: int = doc("passes over each batch", 1)
    clip_eps_low: float = doc("PPO clip: ratio >= 1 - eps_low", 0.2)
    clip_eps_high: float = doc("PPO clip: ratio <= 1 + eps_high (DAPO 'clip higher' uses 0.28)", 0.2)
    adv_std_norm: bool = doc("divide group advantages by their std (false = Dr. GRPO)", True)
    drop_constant_groups: bool = doc("reject groups whose rewards are all equal (zero advantage: no gradient) "
                                     "and generate others in their place (DAPO's dynamic sampling); "
                                     "counted as groups_rejected", False)
    loss_agg: Literal["token-mean", "seq-mean", "constant"] = doc(
        "token-mean | seq-mean | constant (Dr. GRPO: sum / (batch * max_new_tokens))", "token-mean")
    kl_coef: float = doc("k3 KL penalty to the frozen reference; 0 frees the reference model", 0.0)
    behav_cap: float = doc("decoupled: cap on pi_prox / pi_behav", 5.0)
    # clamp, not mask (AReaL's choice): most tokens over the cap have A < 0 and masking them drops the
    # correction of bad tokens the policy has since made likelier (plots/decoupled-k8-tiny/report.md).
    behav_cap_mode: Literal["mask", "clamp"] = doc("decoupled: clamp the weight of tokens over the cap, or mask "
                                                   "them out", "clamp")
    prox: Literal["recompute", "loglinear", "none"] = doc(
        "decoupled: pi_prox by a forward pass, or log-linear interpolation from token versions; "
        "none computes no proximal policy (ppo and dg need none)", "recompute")
    dg_eta: float = doc("Delightful PG gate temperature", 1.0)
    tis_cap: float | None = doc(
        "truncated importance sampling on the engine/trainer mismatch (Yao et al. 2025): w = min(pi_old / "
        "pi_behav, C) per token, pi_old = the trainer's log-probs at the step's start (one extra no-grad forward "
        "when a step makes several updates); ppo: its ratio becomes (pi / pi_old) * w, clipped as before "
        "(inf = plain ppo); dg: w multiplies its loss (inf = full importance weight); decoupled: refused, its "
        "behaviour weight already does this (algo.behav_cap); null = off", None)
    lr: float = doc("AdamW learning rate", 1e-4)
    embedding_lr_scale: float = doc(
        "the token embedding's learning rate (and its tied head's) as a multiple of algo.lr; 0 freezes them. "
        "Adam moves every row of a 262k-word tied head (Gemma) by about lr each step, never-sampled words "
        "included (docs/models.md#gemma-3-270m)", 1.0)
    weight_decay: float = doc("AdamW weight decay", 0.0)
    adam_beta2: float = doc("AdamW beta2", 0.99)
    grad_clip: float = doc("gradient-norm clip (0 disables)", 1.0)
    warmup_steps: int = doc("linear learning-rate warmup, in optimizer steps", 0)

    def __post_init__(self) -> None:
        check(self.group_size >= 2, "algo.group_size", f"must be >= 2 for group advantages, got {self.group_size}")
        check(self.batch_groups > 0, "algo.batch_groups", f"must be > 0, got {self.batch_groups}")
        check(self.minibatches > 0, "algo.minibatches", f"must be > 0, got {self.minibatches}")
        check(self.batch_groups % self.minibatches == 0, "algo.minibatches",
              f"must divide algo.batch_groups={self.batch_groups}, got {self.minibatches}")
        check(self.ppo_epochs > 0, "algo.ppo_epochs", f"must be > 0, got {self.ppo_epochs}")
        check(0 <= self.clip_eps_low < 1, "algo.clip_eps_low", f"must be in [0, 1), got {self.clip_eps_low}")
        check(self.clip_eps_high >= 0, "algo.clip_eps_high", f"must be >= 0, got {self.clip_eps_high}")
        check(self.kl_coef >= 0, "algo.kl_coef", f"must be >= 0, got {self.kl_coef}")
        check(self.behav_cap > 1, "algo.behav_cap", f"must be > 1, got {self.behav_cap}")
        check(self.dg_eta > 0, "algo.dg_eta", f"must be > 0, got {self.dg_eta}")
        check(self.tis_cap is None or self.tis_cap > 0, "algo.tis_cap",
              f"must be > 0 (or null = off), got {self.tis_cap}")
        check(self.tis_cap is None or self.objective != "decoupled", "algo.tis_cap",
              "the decoupled objective already weights each token by pi_prox / pi_behav, capped at algo.behav_cap "
              "(behav_cap_mode=clamp is truncated importance sampling); unset algo.tis_cap, or use ppo or dg")
        check(self.objective != "decoupled" or self.prox != "none", "algo.prox",
              "the decoupled objective needs a proximal policy: set algo.prox to recompute or loglinear")
        check(self.lr > 0, "algo.lr", f"must be > 0, got {self.lr}")
        check(self.grad_clip >= 0, "algo.grad_clip", f"must be >= 0, got {self.grad_clip}")
