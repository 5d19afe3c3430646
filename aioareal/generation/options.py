"""The engine's options in one record (`Engine`, `HFEngine`, `make_engine` take it whole), and the one
place that builds it from the config's `generation` section."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config.schema import GenerationConfig
from .sampling import SamplingParams, fused_sampler_enabled
from .turns import StopStrings


@dataclass(frozen=True)
class EngineOptions:
    """How an engine is sized and how it decodes. `fuse`: q/k/v and gate/up as one matmul each, over
    fused weights the model's parameters are re-pointed into (fusion.py); False for a model that also
    trains. `overlap`: launch each step before reading the previous one's tokens (engine.py); True,
    False or "auto" (on for CUDA). `fused_sampler`: the compiled sampler that reads the logits once
    (`fused_sample`, sampling.py). `shared_prefix`: decode with each group's prompt keys read once (prefix.py);
    eager only. The HF fallback (hf_backend.py) reads the sizes, `params`, `seed`, `recompute_kv`,
    `timed` and `stop`."""

    num_slots: int  # sequences decoded at once (KV-cache slots)
    max_len: int  # prompt + completion tokens a slot holds
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    cuda_graphs: bool = False
    recompute_kv: bool = True  # docs/architecture.md#rules, rule 3
    compile: bool = False
    timed: bool = False  # record each phase's seconds for the metrics
    fuse: bool = True
    overlap: bool | str = "auto"
    fused_sampler: bool = False
    shared_prefix: bool = False
    stop: StopStrings | None = None  # strings that end a plain group's sequence (eval's lm-eval protocol)
    # Token ids every prompt is expected to start with (eval's few-shot context, a long system prompt):
    # their K/V is computed once and copied into each slot, and only the rest of a prompt is prefilled.
    prompt_prefix: tuple[int, ...] = ()


def engine_options(g: GenerationConfig, num_slots: int, max_len: int, seed: int, device: torch.device,
                   timed: bool = True) -> EngineOptions:
    """A training engine's options from generation.*: `num_slots` when generation.num_slots is 0 (the
    admission bound's), `seed` the sampling seed (each torchrun rank has its own), `device` the
    generator's (generation.fused_sampler=auto depends on it)."""
    return EngineOptions(g.num_slots or num_slots, max_len, SamplingParams(g.temperature, g.top_p, g.max_new_tokens),
                         seed=seed, cuda_graphs=g.cuda_graphs, recompute_kv=g.recompute_kv, compile=g.compile,
                         timed=timed, overlap=g.overlap, fused_sampler=fused_sampler_enabled(g.fused_sampler, device),
                         shared_prefix=g.shared_prefix)
