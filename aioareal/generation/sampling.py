"""Token sampling on the device, with no host sync, and the rule that picks a sampler.

Three samplers draw the same distribution. The exponential race (`sample`): argmax(log p - log E),
E ~ Exp(1), is distributed as p, with no cumulative sum and no host-side random number (gpt-fast
does the same). The same race with its passes over the logits fused by torch.compile
(`fused_sample`, generation.fused_sampler). And on the CPU, where the race's one draw per vocabulary
entry costs more than the LM head, a draw by inverting the softmax's CDF, one uniform number a row
(`inverse_cdf_sample`). The logprob returned for each sampled token is under the full
temperature-scaled distribution, which is what the trainer recomputes (its logits are divided by the
same temperature; in bf16 the two differ by rounding); with top_p < 1 the draw is from the truncated
distribution, as in verl and AReaL. `sampler_for` and the decode rules below decide which the engine
takes; the simulator (lab/simulate/costed_workers.py) follows the same rules.
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
    """logits (n, V) -> (tokens (n,) int64, logprobs (n,) float32).

    Written for few passes over the (n, V) fp32 tensor (for Qwen's 151,936 words at 256 rows each
    pass moves 155 MB): the token is argmax(logits/T - log E), the same as over log-probabilities
    because log-softmax only shifts a row by its log-sum-exp, and the log-prob of the chosen token
    is one gather minus that log-sum-exp."""
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
    """log E for E ~ Exp(1), shaped like `like`. On the CPU E is drawn as -log U, U ~ Uniform[0, 1):
    the same distribution, and a uniform draw and a log cost less there than torch's CPU
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
# The CPU's sampler: a categorical draw by inverting the softmax's CDF, one uniform number per row.
#
# The exponential race (`sample` above) draws one random number per vocabulary entry: on a GPU that is
# free, on the CPU it is the cost of a step's sampling (a 49,152-word vocabulary at 64 rows: three
# million draws and two logarithms each, more than the LM head's own matmul in bf16). Here a row's
# weights e = exp(logits / T - max) are summed per block of words; one uniform draw u in [0, total)
# picks the block whose cumulative sum (fp64, across blocks) passes u, and then the word inside it by
# the block's own cumulative sum (fp32). Two levels keep the rounding of the running sums to a
# block's length rather than the vocabulary's: a word's chance is its weight over the total up to
# that rounding, about 1e-7 of a block's mass. The log-prob returned is exact (the chosen word's
# logit minus the row's log-sum-exp), as `sample`'s is: it is what the trainer recomputes.
#
# Greedy decoding and top_p < 1 go to `sample` (an argmax; a sort).

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


# -- fused_sampling ----------------------------------------------------------------------------------
# The sampler with its passes over the logits fused by `torch.compile` (generation.fused_sampler).
#
# `sample` (`sample` above) makes several passes over the (n, V) logits: the fp32 cast, the temperature
# divide, the log-sum-exp, the noise, the subtraction, the argmax, the gather. Here the whole
# exponential race after the noise draw is one function that inductor compiles into per-row
# reductions that read the logits once (bf16 or fp32 in, fp32 arithmetic): the row max and
# log-sum-exp, argmax(logits / T - log E), and the chosen token's logit.
#
# The noise is drawn eagerly, U ~ Uniform[0, 1) from the engine's `torch.Generator` (one pass that
# writes (n, V) fp32), and turned into log E = log(-log U) inside the compiled function: inductor
# graph-breaks on random ops given a generator, so drawing inside it would lose the per-seed
# reproducibility. On the CPU this is the same draw and the same transform as `sample`'s, so the two
# sample the same tokens for the same generator state; on CUDA `sample` draws with `exponential_`,
# a different stream of the same distribution.
#
# Greedy decoding fuses too (no noise; the log-prob is at temperature 1, as in `sample`); top_p < 1
# needs a sort and falls back to `sample`.

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
    """Whether the CPU decodes only the `live` running slots of the first n (engine._decode_live)
    rather than all n. Gathering the live slots' cache rows costs about what attention over them
    does, so it pays when contexts are short (the gather is cheap) or at least half the slots are
    done (the attention saved outweighs the gather); with most slots still live over a long context
    the gather costs more than it saves."""
    return live < n and (span <= SHORT_SPAN or 2 * live <= n)


def resolve_overlap(overlap: bool | str, device: torch.device) -> bool:
    """`overlap` as the config gives it (true, false or "auto") -> whether the engine overlaps.
    Auto is on for CUDA only: on the CPU ops are synchronous, so there is no device to keep busy."""
    if overlap == "auto":
        return device.type == "cuda"
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap must be true, false or 'auto', got {overlap!r}")
    return overlap


def sampler_for(device: torch.device, fused: bool) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The compiled exponential race where asked (`fused_sample`); else on the CPU the inverse-CDF
    draw, one random number per row (`inverse_cdf_sample`: the race's one draw per word costs more than
    the LM head there), and on a GPU the race, whose per-word draws are parallel and cheap."""
    if fused:
        return fused_sample
    return inverse_cdf_sample if device.type == "cpu" else sample
