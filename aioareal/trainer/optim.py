"""Which AdamW the trainer runs: torch's `fused` (one kernel for the whole update, one pass over each
tensor; fastest on CUDA and the CPU) where every trained parameter is a floating tensor on one such
device, FSDP2's DTensors included (torch 2.13 shards `_fused_adamw_` pointwise); `foreach` for mixed
devices; bf16 moments with `train.optimizer_moments=bfloat16` (trainer/bf16_moments.py).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from ..config import AlgoConfig
from ..errors import UserError
from .bf16_moments import AdamWBf16Moments

FUSED_DEVICES = ("cuda", "cpu")


def adamw_kind(params: Iterable[torch.Tensor]) -> dict[str, bool]:
    """`{"fused": True}` or `{"foreach": True}`, to pass to `torch.optim.AdamW` for `params`."""
    params = list(params)
    # A DTensor's `.device` is its local shard's, which is where the fused kernel runs.
    kinds = {p.device.type for p in params}
    fused = len(kinds) == 1 and kinds <= set(FUSED_DEVICES) and all(torch.is_floating_point(p) for p in params)
    return {"fused": True} if fused else {"foreach": True}


def embedding_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The token embedding's weight and the head's, once each (one tensor where they are tied)."""
    found: list[torch.Tensor] = []
    for get in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, get, lambda: None)()
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and not any(weight is w for w in found):
            found.append(weight)
    return found


def freeze_embeddings(model: torch.nn.Module, algo: AlgoConfig) -> None:
    """algo.embedding_lr_scale=0: the embedding (and the head tied to it) take no gradient at all,
    which also spares the head's weight gradient, the largest matmul of a big-vocabulary backward."""
    if algo.embedding_lr_scale == 0:
        for weight in embedding_weights(model):
            weight.requires_grad_(False)


def param_groups(params: list[torch.Tensor], model: torch.nn.Module, algo: AlgoConfig) -> list[dict]:
    """One group at algo.lr, and the embedding's at algo.lr x algo.embedding_lr_scale where it differs."""
    slow = [p for p in params if any(p is w for w in embedding_weights(model))] if algo.embedding_lr_scale != 1 else []
    rest = [p for p in params if not any(p is w for w in slow)]
    groups = [{"params": rest, "lr": algo.lr}]
    return groups + [{"params": slow, "lr": algo.lr * algo.embedding_lr_scale}] if slow else groups


def build_optimizer(params: list[torch.Tensor], algo: AlgoConfig, moments: str, sharded: bool,
                    model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
    """The trainer's AdamW over `params`, its moments in fp32 (torch's) or bf16 (train.optimizer_moments)."""
    settings = {"lr": algo.lr, "betas": (0.9, algo.adam_beta2), "weight_decay": algo.weight_decay}
    groups = param_groups(params, model, algo) if model is not None else params
    if moments == "float32":
        return torch.optim.AdamW(groups, **settings, **adamw_kind(params))
    if sharded:  # FSDP2's sharded checkpoints are tested with torch's AdamW state only
        raise UserError("train.optimizer_moments=bfloat16 runs in one process; under torchrun use float32 "
                        "(FSDP2 already shards the moments across ranks)")
    return AdamWBf16Moments(groups, **settings)


# Adam moves each weight by about lr a step whatever its size, so what a learning rate does is lr
# relative to the weights' typical magnitude; past this bound pretrained models have collapsed
# (docs/log/2026-12-gemma3.md, docs/log/figures-from-code.md), and the run says so at start-up.
MAX_RELATIVE_STEP = 2.5e-4


def typical_weight(model: torch.nn.Module) -> float:
    """Mean |w| over the model's matrices, the token embedding and an untied head left out."""
    embeddings = embedding_weights(model)
    total, count = 0.0, 0
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and not any(p is e for e in embeddings):
                total += float(p.detach().abs().float().sum())
                count += p.numel()
    return total / count if count else 0.0


def relative_step_warning(model: torch.nn.Module, lr: float) -> str | None:
    """One line when `lr` is past MAX_RELATIVE_STEP of the model's typical weight (pretrained models)."""
    typical = typical_weight(model)
    if typical <= 0 or lr / typical <= MAX_RELATIVE_STEP:
        return None
    return (f"warning: algo.lr={lr:g} is {lr / typical:.1e} of this model's typical weight (mean |w| {typical:.3f}); "
            f"Adam moves every weight by about lr a step, and past {MAX_RELATIVE_STEP:g} of it pretrained models have "
            f"collapsed within a few steps: try algo.lr={typical * MAX_RELATIVE_STEP / 2:.0e}")
