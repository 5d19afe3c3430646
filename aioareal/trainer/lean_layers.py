"""Leaner activations for the trained model's RMSNorms and SwiGLU MLPs (train.lean_activations).

What autograd keeps is most of a step's memory beyond weights and AdamW (docs/log/2026-11-memory.md),
and transformers' chains of small ops each keep their inputs. `_RMSNorm` keeps the input and the
per-row rsqrt, not also the fp32 normalised input, and normalises again in the backward; `_SwiGLU`
keeps gate and up and recomputes silu(gate). Both compute the forward op for op as the modules do,
and the gradients to rounding. A forward is swapped only after a probe on random inputs shows the
two agree (`make_lean`): a family that writes its norm otherwise (Gemma's `1 + weight`) keeps its own.
"""
from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _wide(x: torch.Tensor) -> torch.dtype:
    """The norm's compute dtype: fp32 for 16- and 32-bit inputs, as the modules cast (fp64 stays)."""
    return torch.promote_types(x.dtype, torch.float32)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(_wide(x))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, rstd, weight = ctx.saved_tensors
        normed = x.to(_wide(x)) * rstd
        grad = grad.to(normed.dtype)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * normed.to(x.dtype)).reshape(-1, weight.shape[-1]).sum(0).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            scaled = grad * weight.to(normed.dtype)  # d loss / d normed
            grad_x = (rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_weight, None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate)  # the kernel SiLU's own backward uses
        return grad_gate, grad * F.silu(gate)


MLP_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")


def _lean_norm(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _lean_mlp(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(_SwiGLU.apply(self.gate_proj(x), self.up_proj(x)))


def _kind(module: nn.Module) -> Any:
    """The lean forward this module might take, or None when it is neither block."""
    if isinstance(getattr(module, "variance_epsilon", None), float) and getattr(module, "weight", None) is not None \
            and module.weight.dim() == 1:
        return _lean_norm
    if all(isinstance(getattr(module, name, None), nn.Module) for name in MLP_PARTS):
        return _lean_mlp
    return None


def _agrees(module: nn.Module, lean: Any, width: int) -> bool:
    """Whether `lean` computes the module's own forward's values and gradients on random inputs."""
    weight = next(module.parameters())
    draws = torch.Generator().manual_seed(0)  # the probe leaves the run's random state alone
    x = torch.randn(2, 5, width, generator=draws).to(weight.device, weight.dtype)
    results = []
    for forward in (module.forward, types.MethodType(lean, module)):
        module.zero_grad(set_to_none=True)
        probe = x.clone().requires_grad_(True)
        out = forward(probe)
        (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
        grads = [p.grad for p in module.parameters() if p.requires_grad]
        results.append([out.detach(), probe.grad, *grads])
    module.zero_grad(set_to_none=True)
    tol = {"atol": 1e-4, "rtol": 1e-3} if weight.dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    return all(torch.allclose(a.float(), b.float(), **tol) for a, b in zip(results[0], results[1]))


def make_lean(model: nn.Module) -> int:
    """Give each RMSNorm and SwiGLU MLP whose class passes the probe (one per class and width) its
    lean forward, on the instance; returns how many took it."""
    verdicts: dict[tuple[type, int], bool] = {}
    swapped = 0
    for module in model.modules():
        lean = _kind(module)
        if lean is None or "forward" in vars(module):  # a forward set on the instance (compiled, ...) stays
            continue
        width = module.weight.shape[0] if lean is _lean_norm else getattr(module.gate_proj, "in_features", None)
        key = (type(module), width)
        if width is None:
            continue
        if key not in verdicts:
            verdicts[key] = _agrees(module, lean, width)
        if verdicts[key]:
            module.forward = types.MethodType(lean, module)
            swapped += 1
    return swapped
