"""Samples that cannot move the weights, left out of the trainer's forward and backward.

A sample whose advantage is exactly zero adds exactly zero to the gradient of every objective
(ppo, decoupled and dg each scale a token's term by its advantage) unless a KL penalty pulls it
toward the reference. GRPO gives many: every sample of a group whose rewards are all equal, most
groups early in a run (nothing solved yet) and again late (a prompt always solved). Their forward
and backward only cost time, so they are set aside here and only their counts reach the loss's
normalisers (token-mean's tokens, seq-mean's sequences): the update is the whole mini-batch's.

One sample of each mini-batch is always computed, even with a zero advantage, so that every
parameter gets a (zero) gradient and the optimizer steps as it would on the whole batch: AdamW
moves on its moments even at a zero gradient, and skips a parameter that has none.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..group import Sample


@dataclass
class SetAside:
    """What a mini-batch left out: counted in its loss's normalisers, computed nowhere."""

    rows: int = 0
    completion_tokens: int = 0  # tokens a loss term would have covered (an episode's model tokens)


def set_aside(samples: list[Sample], enabled: bool) -> tuple[list[Sample], SetAside]:
    """The samples to compute, and the counts of those left out (zero advantage). Keeps the shortest
    zero-advantage sample where nothing else would be computed."""
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
