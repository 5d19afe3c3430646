"""The CPU's sampler: a categorical draw by inverting the softmax's CDF, one uniform number per row.

The exponential race (sampling.py) draws one random number per vocabulary entry: on a GPU that is
free, on the CPU it is the cost of a step's sampling (a 49,152-word vocabulary at 64 rows: three
million draws and two logarithms each, more than the LM head's own matmul in bf16). Here a row's
weights e = exp(logits / T - max) are summed per block of words; one uniform draw u in [0, total)
picks the block whose cumulative sum (fp64, across blocks) passes u, and then the word inside it by
the block's own cumulative sum (fp32). Two levels keep the rounding of the running sums to a
block's length rather than the vocabulary's: a word's chance is its weight over the total up to
that rounding, about 1e-7 of a block's mass. The log-prob returned is exact (the chosen word's
logit minus the row's log-sum-exp), as `sample`'s is: it is what the trainer recomputes.

Greedy decoding and top_p < 1 go to `sample` (an argmax; a sort).
"""
from __future__ import annotations

import math

import torch

from .sampling import SamplingParams, sample


def block_size(vocab: int) -> int:
    """The smallest divisor of `vocab` at least its square root: blocks that tile the row with no
    padding, about as many blocks as words in a block (49,152 -> 256; 151,936 -> 1,187)."""
    root = math.isqrt(vocab - 1) + 1 if vocab > 1 else 1  # ceil(sqrt(vocab))
    return next(d for d in range(root, vocab + 1) if vocab % d == 0)


def inverse_cdf_sample(logits: torch.Tensor, params: SamplingParams,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (n, V) -> (tokens (n,) int64, logprobs (n,) float32), as `sample` returns them."""
    if params.greedy or params.top_p < 1.0:
        return sample(logits, params, generator)
    inv_t = 1.0 / params.temperature
    top = logits.amax(dim=-1, keepdim=True).float()  # (n, 1), read in the logits' own dtype
    # One fp32 copy of the row, then in place: (logits - max) / T, exp -> weights in [0, 1].
    weights = logits.to(torch.float32, copy=True).sub_(top)
    if inv_t != 1.0:
        weights.mul_(inv_t)
    tokens, total = _draw(weights.exp_(), generator)
    lse = top.squeeze(-1) * inv_t + total.log()
    return tokens, logits.gather(-1, tokens[:, None]).squeeze(-1).float() * inv_t - lse


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One word per row of non-negative `weights` (n, V), with probability weight / row total; and
    the row totals (n,) fp32."""
    n, vocab = weights.shape
    size = block_size(vocab)
    blocks = weights.view(n, vocab // size, size)
    cum = blocks.sum(dim=-1).double().cumsum(dim=-1)  # (n, blocks): fp32 sums of a block, fp64 across
    u = torch.rand(n, 1, generator=generator, dtype=torch.float64, device=weights.device) * cum[:, -1:]
    # right=True: the first cumulative sum above u, so an empty block (sum 0) is never chosen.
    block = torch.searchsorted(cum, u, right=True).clamp_(max=cum.shape[1] - 1)  # (n, 1)
    before = torch.where(block > 0, cum.gather(-1, (block - 1).clamp(min=0)), 0.0)
    inner = blocks.gather(1, block[:, :, None].expand(n, 1, size)).squeeze(1).cumsum(dim=-1)  # (n, size)
    word = torch.searchsorted(inner, (u - before).float(), right=True)
    # Rounding may put u past the block's own fp32 total: take its last word of positive weight.
    last = (inner < inner[:, -1:]).sum(dim=-1, keepdim=True)
    return (block * size + torch.minimum(word, last)).squeeze(-1), cum[:, -1].float()
