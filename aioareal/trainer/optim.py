"""Which AdamW implementation the trainer's optimizer runs: `fused` or `foreach`.

`fused=True` is one kernel per parameter group and dtype for the whole update (read the gradient,
both moments and the weight once), where `foreach` is one launch per elementwise op over lists of
tensors and the default for-loop one per op per parameter. torch has the fused kernel on CUDA and
on the CPU; on the CPU it is the fastest too (one pass over each tensor's data, not one per
elementwise op, and the fewest dispatches). Fused is
taken where every trained parameter is a floating tensor on one of those devices (all CUDA or all
CPU); FSDP2's sharded parameters (DTensors) qualify too: torch 2.13 shards `_fused_adamw_` as a
pointwise op over the local shards (tests/trainer/test_train_compile.py checks that it equals foreach on a
DTensor). Mixed devices take `foreach`.

`train.optimizer_moments=bfloat16` takes AdamW with bf16 moments instead (trainer/bf16_moments.py).
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


def build_optimizer(params: list[torch.Tensor], algo: AlgoConfig, moments: str, sharded: bool) -> torch.optim.Optimizer:
    """The trainer's AdamW over `params`, its moments in fp32 (torch's, fused where it can be) or
    bf16 (train.optimizer_moments)."""
    settings = {"lr": algo.lr, "betas": (0.9, algo.adam_beta2), "weight_decay": algo.weight_decay}
    if moments == "float32":
        return torch.optim.AdamW(params, **settings, **adamw_kind(params))
    if sharded:  # FSDP2's sharded checkpoints are tested with torch's AdamW state only
        raise UserError("train.optimizer_moments=bfloat16 runs in one process; under torchrun use float32 "
                        "(FSDP2 already shards the moments across ranks)")
    return AdamWBf16Moments(params, **settings)
