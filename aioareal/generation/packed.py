"""The engine's linear layers with their weights packed once for the CPU's matmul units.

torch's eager bf16 matmul on the CPU hands the weight to oneDNN in its plain layout, and oneDNN
reorders it into the blocked layout its AMX / AVX-512 kernels read on every call. At a decode
batch (tens of rows) that reorder costs about as much as the multiply itself, and the LM head's
(vocabulary x hidden) weight is the largest of all. `PackedLinears` keeps one packed copy of each
weight (`mkldnn._reorder_linear_weight`, the layout inductor's frozen graphs use) and multiplies
with `mkldnn._linear_pointwise`, which computes what `F.linear` does, to the bit (tests). The
weights change only when the engine adopts a new version: `drop()` then, and each weight is packed
again at its next use, once per version rather than once per decode step.

On: the CPU, bf16 weights (fp32's kernels do not reorder as much), oneDNN present with a bf16
reorder for this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT: an AVX2-only CPU has none and torch raises),
eager decoding (a compiled decode step traces F.linear). Elsewhere every call is plain `F.linear`.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


def packing_pays(weight: torch.Tensor, compiled: bool) -> bool:
    """Whether packing is on for a model whose weights are like `weight` (the module docstring)."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and not compiled
            and torch.backends.mkldnn.is_available() and _ops_present())


@functools.cache
def _ops_present() -> bool:
    """The packing ops exist and this CPU can run them in bf16 (tried once on a small weight)."""
    try:
        probe = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 16, dtype=torch.bfloat16), probe, None, "none", [], "")
        return True
    except (AttributeError, RuntimeError):
        return False


class PackedLinears:
    """x @ W.T + b for the engine's weights: packed per weight where `enabled`, else F.linear."""

    def __init__(self, enabled: bool, rows_hint: int = 64) -> None:
        self.enabled, self.rows_hint = enabled, rows_hint  # rows_hint: the batch oneDNN packs for
        self._packed: dict[int, torch.Tensor] = {}  # id(weight) -> its packed copy, this version's

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not self.enabled:
            return F.linear(x, weight, bias)
        packed = self._packed.get(id(weight))
        if packed is None:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.rows_hint)
            self._packed[id(weight)] = packed
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    def module(self, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A model's own projection: packed where it is exactly `nn.Linear`, else its own forward."""
        if not self.enabled or type(linear) is not nn.Linear:
            return linear(x)
        return self(x, linear.weight, linear.bias)

    def drop(self) -> None:
        """The weights changed (a new version adopted): pack each again at its next use."""
        self._packed.clear()
