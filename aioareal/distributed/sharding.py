"""The trainer's model across ranks: FSDP2 (`fully_shard`), and the ways back to full weights
(docs/architecture.md#scale-out-rank-by-rank).

Every rank loads the whole policy, then `shard_policy` keeps 1/N of each parameter: one FSDP2 unit
per decoder layer and a root unit (`TokenLogprobs`: embeddings, final norm, head). Gradients are
summed across ranks, not averaged (divide factor 1): each rank's loss is already normalised by the
global counts, so the sum is the whole batch's gradient. Full weights come back by gathering, in the
same order on every rank: into the generator's staging buffer (weightsync), and into `Mirror`.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ..errors import UserError


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a Hugging Face model: the classes it names in `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise UserError(f"cannot shard {type(model).__name__} under torchrun: its class names no decoder layer "
                        "class in _no_split_modules")
    return layers


def mixed_precision(device: torch.device, compute_dtype: torch.dtype) -> MixedPrecisionPolicy:
    """bf16 parameters with fp32 gradient reduction on CUDA; fp16 (V100) keeps fp32 parameters under
    autocast with its loss scaler; the CPU computes in fp32."""
    if device.type == "cuda" and compute_dtype == torch.bfloat16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_policy(policy: nn.Module, model: nn.Module, device: torch.device, compute_dtype: torch.dtype) -> None:
    """Shard `policy` (the `TokenLogprobs` around `model`) in place over the default process group."""
    mp = mixed_precision(device, compute_dtype)
    units = []
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp)
        units.append(layer)
    fully_shard(policy, mp_policy=mp)
    for unit in [*units, policy]:
        assert isinstance(unit, FSDPModule)
        unit.set_gradient_divide_factor(1.0)  # the ranks' gradients add up (see the module docstring)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: gathered from every rank when it is a shard (a collective), else itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


class Mirror:
    """A plain, unsharded copy of the trainer's model, refreshed from the shards on demand, for held-out
    evaluation's engine (whose step counts differ between ranks) and rank 0's export."""

    def __init__(self, model: nn.Module) -> None:
        """`model` not yet sharded: the copy starts with its weights."""
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def refresh(self, sharded: nn.Module) -> nn.Module:
        """Gather every parameter of `sharded` into the copy (a collective: every rank calls it)."""
        for source, target in zip(sharded.parameters(), self.model.parameters()):
            target.copy_(full_tensor(source))
        return self.model
