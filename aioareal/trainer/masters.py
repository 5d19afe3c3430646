"""`train.precision=masters`: the trainer's forward and backward on a working copy of the model in
the compute dtype (model.train_dtype, bf16), the optimizer on the fp32 master weights kept apart.

Under autocast (`train.precision=autocast`) the model itself is fp32: every linear casts its fp32
input and weight to bf16 on each call, and everything between the matmuls (the residual stream,
RMSNorm, rotary embeddings, SiLU x gate) runs and is saved for the backward in fp32. The working
copy is bf16 throughout: no casts, and half the bytes of every activation kept for the backward.

The masters are the model's own parameters (the checkpoint, the weight sync and the evaluator read
them as before); the working copy shares nothing with them. Each working parameter's gradient is
added into its master's fp32 `.grad` as soon as the backward has accumulated it (a post-accumulate
hook) and then freed, so gradients sum over micro-batches in fp32, as they do under autocast, and
no full set of bf16 gradients is ever resident. After each optimizer step `refresh` copies the
updated masters into the working copy (one rounding to bf16 per weight per step).

`train.compile` is here too (`compile_layers`): each decoder layer compiled by torch.compile, which
the working copy must know of.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..distributed.sharding import decoder_layers
from ..errors import UserError

PRECISIONS = ("autocast", "masters")


class WorkingCopy:
    """A copy of `model` whose floating parameters are in `dtype`; the trainable ones send their
    gradients to `model`'s (the masters') `.grad` in the masters' dtype."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        if layers_compiled(model):  # a copied layer's compiled forward would still call the master layer
            raise UserError("train.precision=masters does not combine with train.compile; set one of them off")
        self.masters = [p for p in model.parameters()]
        # deepcopy with each parameter mapped to its cast: tied weights (one Parameter in two places)
        # stay one parameter, and no fp32 copy of the whole model is ever made.
        memo = {id(p): nn.Parameter(_cast(p, dtype), requires_grad=p.requires_grad) for p in self.masters}
        self.model = copy.deepcopy(model, memo)
        self.params = [memo[id(p)] for p in self.masters]
        for master, work in zip(self.masters, self.params):
            if work.requires_grad:
                work.register_post_accumulate_grad_hook(_to_master(master))

    @torch.no_grad()
    def refresh(self) -> None:
        """The working copy := the masters, cast (after each optimizer step and after a restore)."""
        for master, work in zip(self.masters, self.params):
            work.copy_(master)

    def drop_grads(self) -> None:
        """Gradients a failed backward left on the working copy (before its hooks ran)."""
        for work in self.params:
            work.grad = None


def _cast(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Floating parameters to `dtype`; others (none in the models trained here) as they are."""
    return p.detach().to(dtype) if torch.is_floating_point(p) else p.detach().clone()


def _to_master(master: nn.Parameter):
    def hook(work: torch.Tensor) -> None:
        grad = work.grad
        work.grad = None
        if master.grad is None:
            master.grad = grad.to(master.dtype)
        else:
            master.grad.add_(grad)
    return hook


def working_copy(model: nn.Module, precision: str, compute_dtype: torch.dtype | None,
                 sharded: bool) -> WorkingCopy | None:
    """The working copy `precision` asks for, or None: none under autocast, nor when the trainer
    computes in fp32 (nothing to keep apart)."""
    if precision == "autocast" or compute_dtype is None or compute_dtype == torch.float32:
        return None
    if compute_dtype != torch.bfloat16:  # fp16 weights would need loss scaling of their own
        raise UserError(f"train.precision=masters needs model.train_dtype=bfloat16 (or float32), got {compute_dtype}")
    if sharded:  # FSDP2 keeps its own mixed precision over the shards
        raise UserError("train.precision=masters runs in one process; under torchrun use train.precision=autocast")
    if any(not p.requires_grad for p in model.parameters()):
        raise UserError("train.precision=masters is for full fine-tuning; with model.lora_rank (or "
                        "algo.embedding_lr_scale=0) the frozen weights are already in model.train_dtype: use "
                        "train.precision=autocast")
    return WorkingCopy(model, compute_dtype)


# -- compiled ----------------------------------------------------------------------------------------
# `train.compile`: each decoder layer of the trained model compiled by `torch.compile`.
#
# Per layer, not the whole model: every layer has the same code, so one compiled graph serves them
# all (one compilation, not one per layer), and what lies between the layers (the shared-prompt KV
# cache, the chunked LM head, FSDP2's per-layer gather and reduce-scatter hooks) stays eager. The
# layer's `forward` is what is compiled, not its `__call__`, so the module hooks FSDP2 and gradient
# checkpointing hang on a layer run eagerly around the compiled body, in whichever order they were
# applied. The trainer's shared-prompt path is off for compiled layers: it hands each layer the
# prompts' KV cache, and dynamo guards on that cache's per-layer state, so every layer and shape
# compiled anew (past torch's recompile limit). For the same reason the training forward asks for
# no KV cache (`use_cache=False`, trainer/logprobs.py): one graph serves every layer and shape.
# `dynamic=True` because micro-batch shapes (rows, width) change every step: with static shapes each
# new shape would compile again. peft's LoRA layers trace too (tests/trainer/test_train_compile.py: equal
# to eager, adapters off for the KL reference included). What it buys is fused elementwise kernels
# (RMSNorm, RoPE, SiLU x up, residual adds) in forward and backward; on a GPU that is launch
# overhead and memory traffic saved. On a small CPU compiling a layer with inductor takes longer than
# the default run's whole training, so it is off by default.

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
