"""Which AdamW implementation the trainer's optimizer runs: `fused` or `foreach`.

`fused=True` is one kernel launch per parameter group and dtype for the whole update (read the
gradient, both moments and the weight once), where `foreach` is one launch per elementwise op
over lists of tensors and the default for-loop one per op per parameter. Fused is taken where
every trained parameter is a floating tensor on CUDA; FSDP2's sharded parameters (DTensors)
qualify too: torch 2.13 shards `_fused_adamw_` as a pointwise op over the local shards
(tests/test_train_compile.py checks that it equals foreach on a DTensor). Anywhere else (the CPU,
mixed devices) it is `foreach`: torch's own default picks the for-loop on the CPU.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch


def adamw_kind(params: Iterable[torch.Tensor]) -> dict[str, bool]:
    """`{"fused": True}` or `{"foreach": True}`, to pass to `torch.optim.AdamW` for `params`."""
    params = list(params)
    # A DTensor's `.device` is its local shard's, which is where the fused kernel runs.
    fused = bool(params) and all(p.device.type == "cuda" and torch.is_floating_point(p) for p in params)
    return {"fused": True} if fused else {"foreach": True}
