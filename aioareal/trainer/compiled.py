"""`train.compile`: each decoder layer of the trained model compiled by `torch.compile`.

Per layer, not the whole model: every layer has the same code, so one compiled graph serves them
all (one compilation, not one per layer), and what lies between the layers (the shared-prompt KV
cache, the chunked LM head, FSDP2's per-layer gather and reduce-scatter hooks) stays eager. The
layer's `forward` is what is compiled, not its `__call__`, so the module hooks FSDP2 and gradient
checkpointing hang on a layer run eagerly around the compiled body, in whichever order they were
applied. The trainer's shared-prompt path is off for compiled layers: it hands each layer the
prompts' KV cache, and dynamo guards on that cache's per-layer state, so every layer and shape
compiled anew (past torch's recompile limit). For the same reason the training forward asks for
no KV cache (`use_cache=False`, trainer/logprobs.py): one graph serves every layer and shape.
`dynamic=True` because micro-batch shapes (rows, width) change every step: with static shapes each
new shape would compile again. peft's LoRA layers trace too (tests/trainer/test_train_compile.py: equal
to eager, adapters off for the KL reference included). What it buys is fused elementwise kernels
(RMSNorm, RoPE, SiLU x up, residual adds) in forward and backward; on a GPU that is launch
overhead and memory traffic saved. On a small CPU compiling a layer with inductor takes longer than
the default run's whole training, so it is off by default.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..distributed.sharding import decoder_layers


def compile_layers(model: nn.Module, backend: str | Any = "inductor") -> int:
    """Compile the forward of each decoder layer of `model` in place; returns how many.
    `backend`: torch.compile's (tests use "aot_eager", which traces the same graphs without
    generating kernels)."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True, backend=backend)
    return len(layers)


def layers_compiled(model: nn.Module) -> bool:
    """Whether `compile_layers` compiled this model's decoder layers (any module's forward, so that
    it answers for a sharded model too)."""
    return any(hasattr(m.forward, "_torchdynamo_orig_callable") for m in model.modules())
