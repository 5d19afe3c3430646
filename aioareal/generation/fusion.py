"""Fused projections for the engine: q|k|v as one matmul per layer and gate|up as another, the same
bytes read in two launches instead of five.

The fused weight is the model's storage, not a copy: each HF Linear's parameter is re-pointed
(`param.data = fused[rows]`) at its rows, so the weight sync's in-place `param.copy_` lands in it and
every later pass (eager, compiled, or a CUDA graph holding its pointer) sees the new weights.

`fusable` refuses what is not exactly `nn.Linear` (LoRA wrappers, quantised layers), sharded
parameters (FSDP owns their storage), and mixed dtypes, devices or biases. Never fuse a model that
trains (evaluation passes `fuse=False`): `save_pretrained` refuses shared storage, and anything
that later rebinds a parameter (`fully_shard`, `.to()`, `load_state_dict(assign=True)`) silently
detaches it from the tensor the engine reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor


@dataclass
class FusedLinear:
    """Several Linear layers over the same input as one: weight (sum of outputs, inputs)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    sizes: list[int]  # output features of each original layer, in order

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x (..., inputs) -> one (..., size) view per original layer."""
        return F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)


def fusable(linears: list[nn.Module]) -> bool:
    """Whether `linears` can share one weight tensor without changing what any of them computes."""
    if not all(type(m) is nn.Linear for m in linears):  # exactly nn.Linear: no wrapper, no subclass
        return False
    params = [p for m in linears for p in (m.weight, m.bias) if p is not None]
    if any(isinstance(p, DTensor) for p in params):
        return False
    if len({(p.dtype, p.device) for p in params}) != 1:
        return False
    biases = [m.bias is not None for m in linears]
    return all(biases) or not any(biases)


@torch.no_grad()
def fuse(linears: list[nn.Module]) -> FusedLinear | None:
    """Move the layers' weights (and biases) into one fused tensor each and re-point every layer's
    parameters at their rows of it; None, with nothing changed, where `fusable` says no."""
    if not fusable(linears):
        return None
    # no_grad, not inference mode: the parameters stay ordinary tensors an optimizer could update.
    weight = torch.cat([m.weight.detach() for m in linears])  # (sum of outputs, inputs)
    has_bias = linears[0].bias is not None
    bias = torch.cat([m.bias.detach() for m in linears]) if has_bias else None
    sizes = [m.out_features for m in linears]
    start = 0
    for m, size in zip(linears, sizes):
        m.weight.data = weight[start:start + size]  # same Parameter object, storage now the fused rows
        if bias is not None:
            m.bias.data = bias[start:start + size]
        start += size
    return FusedLinear(weight, bias, sizes)


def shares_storage(linear: nn.Linear, fused: FusedLinear) -> bool:
    """Whether `linear`'s weight still lives in `fused` (false after something rebound it)."""
    return linear.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr()
