"""`train.precision=masters`: forward and backward on a bf16 working copy of the model, the
optimizer on the fp32 master weights kept apart. Under autocast everything between the matmuls runs
and is saved in fp32; the working copy is bf16 throughout (no casts, half the activation bytes).

The masters are the model's own parameters (checkpoint, weight sync and evaluator read them). Each
working gradient is added into its master's fp32 `.grad` by a post-accumulate hook and freed, so
gradients sum in fp32 and no full set of bf16 gradients is resident; `refresh` copies the masters
back after each optimizer step. `train.compile` is here too (`compile_layers`).
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ..distributed.world import decoder_layers
from ..errors import UserError

PRECISIONS = ("autocast", "masters")


class WorkingCopy:
    """`model` in `dtype`, sending its gradients to the masters' `.grad` in the masters' dtype."""

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
    """The working copy `precision` asks for, or None (autocast, or an fp32 trainer)."""
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
# `train.compile`: each decoder layer's `forward` compiled (fused elementwise kernels). Per layer: the
# layers share code, so one graph serves them all, and what lies between (the chunked head, FSDP2's
# hooks) stays eager; compiling `forward`, not `__call__`, leaves the hooks of FSDP2 and gradient
# checkpointing eager around it. No KV cache reaches a compiled layer (shared prompts off,
# `use_cache=False`): dynamo guards on its per-layer state, one compile per layer and shape.
# `dynamic=True`: micro-batch shapes change every step. Off by default: on a small CPU compiling
# takes longer than the default run's training (docs/log/figures-from-code.md).

def compile_layers(model: nn.Module, backend: str | Any = "inductor") -> int:
    """Compile the forward of each decoder layer of `model` in place; returns how many. `backend`:
    torch.compile's (tests use "aot_eager")."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True, backend=backend)
    return len(layers)


def layers_compiled(model: nn.Module) -> bool:
    """Whether `compile_layers` compiled this model's layers (any module's, so a sharded model too)."""
    return any(hasattr(m.forward, "_torchdynamo_orig_callable") for m in model.modules())
