"""`--fp32-matmuls`: bf16 matmuls computed in fp32, for memory measurements on a CPU without bf16
matmul units.

On an AVX2-only CPU torch's bf16 matmul has no fast kernel: it runs some 50x slower than fp32
(measured 2026-11-26: 0.3 against 16.6 GFLOP/s for 2,048 x 576 @ 576 x 1,536 on 2 loaded cores), so a
bf16 training step of a 135M-parameter model takes hours. Memory does not depend on how a matmul
is computed but on which tensors exist: under this mode every bf16 `mm`, `addmm`, `bmm` and
`baddbmm` upcasts its operands, multiplies in fp32 and returns the bf16 result it would have
returned, so every tensor the step keeps has its bf16 dtype and shape, and the step runs at fp32
speed. What it adds: each such call's fp32 operand copies and output, freed when it returns (the
largest, the 49k-word head's weight, 0.11 GB for SmolLM2-135M), the same on both sides of a
comparison. Results differ from a true bf16 matmul by its rounding (fp32 accumulation either way).
Timings under it say nothing about bf16 speed.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


def _up(x: Any) -> Any:
    return x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else x


class Fp32Matmuls(TorchDispatchMode):
    """Inside `with Fp32Matmuls():`, bf16 matmuls run in fp32 and return bf16 (autograd's backward
    matmuls included: the mode is active while `backward()` is called from inside it)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func in MATMULS and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            return func(*map(_up, args), **{k: _up(v) for k, v in kwargs.items()}).to(torch.bfloat16)
        return func(*args, **kwargs)
