"""One RL training step, top to bottom, each phase timed (`time_<phase>` in metrics.jsonl)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from .. import losses
from ..errors import UserError
from ..group import Group
from ..timing import PhaseTimer
from .trainer import StepSums, Trainer


def train_step(trainer: Trainer, groups: list[Group],
               publish: Callable[[int], None] = lambda version: None) -> dict[str, float]:
    """Train on a batch of B groups, bump the policy version, `publish` it (weightsync); returns
    the step's metrics with one `time_<phase>` entry per phase."""
    timer = PhaseTimer(trainer.device)
    with timer("advantages", host=True):  # group-normalised rewards (docs/architecture.md rule 4), one per sample
        assign_advantages(groups, trainer.algo.adv_std_norm)
    with timer("pack", host=True):  # mini-batches of whole groups, packed into micro-batches by token budget
        minibatches = trainer.pack(groups)
    with timer("fixed_logprobs"):  # pi_prox (decoupled; tis_cap's pi_old) and the KL reference
        trainer.fill_fixed_logprobs(minibatches)
    sums = StepSums()
    updates = trainer.algo.ppo_epochs * len(minibatches)
    for epoch in range(trainer.algo.ppo_epochs):
        for k, part in enumerate(minibatches):
            # The policy's version at this update, between v and v+1 (loglinear pi_prox needs it).
            theta_version = trainer.version + (epoch * len(minibatches) + k) / updates
            with timer("loss"):  # forward + backward of every micro-batch; gradients add up
                trainer.accumulate(part, theta_version, sums)
            with timer("optimizer"):  # clip, step (or skip a non-finite update), schedule
                trainer.optimizer_step(sums)
    trainer.version += 1
    with timer("publish"):  # stage the new weights for the generator (no host wait)
        publish(trainer.version)
    metrics = trainer.summary(minibatches, sums)  # the step's one host sync
    check_gap(metrics["logprob_gap_max"], trainer.max_logprob_gap, trainer.version)
    return {**metrics, **{f"time_{phase}": s for phase, s in timer.take().items()}}


def check_gap(gap: float, bound: float, version: int) -> None:
    """Stop the run when the generator's and the trainer's log-probs differ by more than `bound` nats
    on a token the trainer's version sampled: it samples from another model than the one trained."""
    if gap > bound:
        raise UserError(f"step {version}: logprob_gap_max {gap:.3g} nats exceeds train.max_logprob_gap={bound:g}: "
                        "the generator's log-probs differ from the trainer's; try generation.backend=hf")


def assign_advantages(groups: list[Group], std_norm: bool) -> None:
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)  # (B, G), on the CPU
    advantages = losses.group_advantages(rewards, std_norm).tolist()  # CPU tensors: no device sync
    for group, row in zip(groups, advantages):
        for sample, advantage in zip(group.samples, row):
            sample.advantage = advantage
