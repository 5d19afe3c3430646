"""Token sampling on the device, with no host sync, and the rules that pick a sampler and decode path.

Three samplers draw the same distribution: the exponential race `sample` (argmax(log p - log E),
E ~ Exp(1): no cumulative sum, no host-side random number), the race fused by torch.compile
(`fused_sample`), and on the CPU the inverse-CDF draw (`inverse_cdf_sample`, one uniform number a row).
Each returns the token's log-prob under the full temperature-scaled distribution, which is what the
trainer recomputes; with top_p < 1 the draw is from the truncated distribution, as in verl and AReaL.
The simulator (lab/simulate/costed_workers.py) follows the same rules.
"""
from __future__ import annotations

import math
from collections.abc import Callable
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
    """logits (n, V) -> (tokens (n,) int64, logprobs (n,) float32), in few passes over the logits:
    argmax(logits/T - log E) picks as over log-probabilities (log-softmax only shifts a row), and the
    token's log-prob is one gather minus the row's log-sum-exp."""
    scaled = logits.float()
    if params.temperature != 1.0 and not params.greedy:
        scaled = scaled / params.temperature
    lse = torch.logsumexp(scaled, dim=-1)
    if params.greedy:
        tokens = scaled.argmax(dim=-1)
    else:
        scores = scaled if params.top_p >= 1.0 else _top_p_filter(scaled - lse[:, None], params.top_p)
        noise = _log_exponential(scaled, generator)
        tokens = torch.sub(scores, noise, out=noise).argmax(dim=-1)
    return tokens, scaled.gather(-1, tokens[:, None]).squeeze(-1) - lse


def _log_exponential(like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """log E for E ~ Exp(1), shaped like `like`. On the CPU E = -log U (U uniform), cheaper there than
    `exponential_`; U = 0 gives E = inf, a token that cannot win."""
    if like.device.type == "cpu":
        return torch.rand(like.shape, generator=generator, dtype=like.dtype).log_().neg_().log_()
    return torch.empty_like(like).exponential_(generator=generator).log_()


def _top_p_filter(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every token outside the smallest set whose probability mass reaches top_p."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()
    drop_sorted = mass_before >= top_p  # the most likely token is always kept (mass_before = 0)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logp.masked_fill(drop, float("-inf"))


# -- inverse_cdf -------------------------------------------------------------------------------------
# The CPU's sampler: the race draws one random number per vocabulary entry, which on the CPU costs more
# than the LM head. Here a row's weights exp(logits / T - max) are summed per block of words; one
# uniform draw picks the block by the fp64 cumulative sum across blocks, then the word by the block's
# fp32 cumulative sum. Two levels bound the rounding to a block's length (about 1e-7 of its mass).
# The log-prob is exact, as `sample`'s. Greedy and top_p < 1 go to `sample`.

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
    """One word per row of `weights` (n, V) >= 0, with probability weight / total; and the totals (n,)."""
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


# -- fused_sampling ----------------------------------------------------------------------------------
# `sample` with its passes fused by torch.compile (generation.fused_sampler): the race after the noise
# draw compiles into per-row reductions that read the logits once. U ~ Uniform[0, 1) is drawn eagerly
# from the engine's generator and turned into log E = log(-log U) inside, since inductor graph-breaks
# on random ops given a generator (per-seed reproducibility would be lost). On the CPU this is
# `sample`'s own draw (the same tokens for the same generator state); on CUDA `sample` uses
# `exponential_`, another stream of the same distribution. top_p < 1 needs a sort: `sample`.

_compiled: dict[bool, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def race(logits: torch.Tensor, uniform: torch.Tensor | None,
         temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (n, V), uniform (n, V) fp32 or None (greedy) -> tokens (n,) int64, logprobs (n,) fp32.
    Eager, this is the reference of what `fused_sample` compiles."""
    scaled = logits.float() / temperature  # (n, V): one read of the logits, fused into the reductions
    lse = torch.logsumexp(scaled, dim=-1)
    scores = scaled if uniform is None else scaled - torch.log(-torch.log(uniform))
    tokens = scores.argmax(dim=-1)
    return tokens, scaled.gather(-1, tokens[:, None]).squeeze(-1) - lse


def fused_sample(logits: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample` with its passes fused (the module docstring); the same signature and distribution."""
    if params.top_p < 1.0 and not params.greedy:
        return sample(logits, params, generator)
    if params.greedy:
        return _race_fn(greedy=True)(logits, None, 1.0)
    uniform = torch.rand(logits.shape, generator=generator, dtype=torch.float32, device=logits.device)
    return _race_fn(greedy=False)(logits, uniform, params.temperature)


def _race_fn(greedy: bool) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """`race` compiled once per process and mode, with symbolic shapes (decode batches vary)."""
    if greedy not in _compiled:
        _compiled[greedy] = torch.compile(race, dynamic=True)
    return _compiled[greedy]


def fused_sampler_enabled(setting: bool | str, device: torch.device) -> bool:
    """generation.fused_sampler: 'auto' is on where inductor has Triton (CUDA), off on the CPU,
    where compiling costs more than a tiny vocabulary's passes; true / false force it."""
    if setting != "auto":
        return bool(setting)
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401  (inductor's CUDA backend)
    except ImportError:
        return False
    return True


# -- decode_rules ------------------------------------------------------------------------------------
# Which decode path the engine takes: small rules kept apart from the engine so the simulator
# (simulate/costed_workers.py) follows the same ones.

# With CUDA graphs the attention span is rounded up to a bucket so few graphs are captured;
# eager decoding attends over exactly the live context.
GRAPH_SPAN_BUCKET = 64
# Attention spans up to which the CPU's decode of the live slots alone pays at any live count.
SHORT_SPAN = 32


def live_decode_pays(live: int, n: int, span: int) -> bool:
    """Whether the CPU decodes only the `live` running slots of the first n (engine._decode_live).
    Gathering their cache rows costs about what attention over them does, so it pays for short
    contexts or when at least half the slots are done."""
    return live < n and (span <= SHORT_SPAN or 2 * live <= n)


def resolve_overlap(overlap: bool | str, device: torch.device) -> bool:
    """`overlap` (true, false or "auto") -> whether the engine overlaps; "auto": CUDA only (on the
    CPU ops are synchronous)."""
    if overlap == "auto":
        return device.type == "cuda"
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap must be true, false or 'auto', got {overlap!r}")
    return overlap


def sampler_for(device: torch.device, fused: bool) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """`fused_sample` where asked; else the inverse-CDF draw on the CPU, the race on a GPU (whose
    per-word draws are parallel and cheap)."""
    if fused:
        return fused_sample
    return inverse_cdf_sample if device.type == "cpu" else sample
