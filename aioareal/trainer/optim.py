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
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

FUSED_DEVICES = ("cuda", "cpu")


def adamw_kind(params: Iterable[torch.Tensor]) -> dict[str, bool]:
    """`{"fused": True}` or `{"foreach": True}`, to pass to `torch.optim.AdamW` for `params`."""
    params = list(params)
    # A DTensor's `.device` is its local shard's, which is where the fused kernel runs.
    kinds = {p.device.type for p in params}
    fused = len(kinds) == 1 and kinds <= set(FUSED_DEVICES) and all(torch.is_floating_point(p) for p in params)
    return {"fused": True} if fused else {"foreach": True}
