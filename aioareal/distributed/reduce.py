"""Global reductions for the trainer: what makes a step on N ranks the step on one.

Each rank trains its own B / N groups, but the loss normalisers (tokens and sequences of a
mini-batch), the step's statistics and the number of micro-batches are global: summed, or the
maximum, over ranks. `LOCAL` is the single-process case and changes nothing; `Global` all-reduces
over the default group on the trainer's thread (the tensors go through the trainer's device, which
NCCL needs).
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist


class Collective(Protocol):
    size: int  # ranks taking part

    def sum_(self, values: torch.Tensor) -> torch.Tensor: ...
    def max_(self, values: torch.Tensor) -> torch.Tensor: ...


class Local:
    """One process: every reduction is the identity."""

    size = 1

    def sum_(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def max_(self, values: torch.Tensor) -> torch.Tensor:
        return values


LOCAL = Local()


class Global:
    """All-reduce over the default process group, in place; returns `values`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.size = dist.get_world_size()

    def _reduce(self, values: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
        on_device = values.to(self.device)
        dist.all_reduce(on_device, op=op)
        if on_device is not values:
            values.copy_(on_device)
        return values

    def sum_(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max_(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, dist.ReduceOp.MAX)
