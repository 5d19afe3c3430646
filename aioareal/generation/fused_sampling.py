"""The sampler with its passes over the logits fused by `torch.compile` (generation.fused_sampler).

`sample` (sampling.py) makes several passes over the (n, V) logits: the fp32 cast, the temperature
divide, the log-sum-exp, the noise, the subtraction, the argmax, the gather. Here the whole
exponential race after the noise draw is one function that inductor compiles into per-row
reductions that read the logits once (bf16 or fp32 in, fp32 arithmetic): the row max and
log-sum-exp, argmax(logits / T - log E), and the chosen token's logit.

The noise is drawn eagerly, U ~ Uniform[0, 1) from the engine's `torch.Generator` (one pass that
writes (n, V) fp32), and turned into log E = log(-log U) inside the compiled function: inductor
graph-breaks on random ops given a generator, so drawing inside it would lose the per-seed
reproducibility. On the CPU this is the same draw and the same transform as `sample`'s, so the two
sample the same tokens for the same generator state; on CUDA `sample` draws with `exponential_`,
a different stream of the same distribution.

Greedy decoding fuses too (no noise; the log-prob is at temperature 1, as in `sample`); top_p < 1
needs a sort and falls back to `sample`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .sampling import SamplingParams, sample

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
