"""Token sampling on the device, with no host sync.

The exponential race draws from a categorical distribution without a cumulative sum or a
host-side random number: argmax(log p - log E), E ~ Exp(1), is distributed as p (gpt-fast does
the same). The logprob returned for each sampled token is under the full temperature-scaled
distribution, which is exactly what the trainer recomputes (its logits are divided by the same
temperature); with top_p < 1 the draw is from the truncated distribution, as in verl and AReaL.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    greedy: bool = False


def sample(logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (n, V) -> (tokens (n,) int64, logprobs (n,) float32)."""
    logits = logits.float()
    if params.greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logp.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    scores = logp if params.top_p >= 1.0 else _top_p_filter(logp, params.top_p)
    noise = torch.empty_like(logp).exponential_(generator=generator)
    tokens = (scores - noise.log()).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def _top_p_filter(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every token outside the smallest set whose probability mass reaches top_p."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()
    drop_sorted = mass_before >= top_p  # the most likely token is always kept (mass_before = 0)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logp.masked_fill(drop, float("-inf"))
