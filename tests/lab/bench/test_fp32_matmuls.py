"""bench/train_precision.py `Fp32Matmuls`: bf16 matmuls computed in fp32 keep every tensor's bf16 dtype and shape."""
from __future__ import annotations

import torch

from aioareal.lab.bench.train_precision import Fp32Matmuls


def test_bf16_matmuls_return_bf16_and_equal_the_bf16_ones_to_rounding():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 16, generator=gen).bfloat16().requires_grad_()
    w = torch.randn(12, 16, generator=gen).bfloat16().requires_grad_()
    b = torch.randn(3, 8, 16, generator=gen).bfloat16()
    plain = (torch.nn.functional.linear(a, w), b @ w.T)
    with Fp32Matmuls():
        out = torch.nn.functional.linear(a, w)
        batched = b @ w.T
        out.float().sum().backward()  # the backward's matmuls run under the mode too
    for got, want in zip((out, batched), plain):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        torch.testing.assert_close(got, want, atol=0.1, rtol=0.02)
    assert a.grad.dtype == w.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.grad.float(), w.float().sum(0).expand(8, 16), atol=0.1, rtol=0.02)


def test_fp32_matmuls_are_left_alone():
    a, w = torch.randn(4, 5), torch.randn(5, 3)
    with Fp32Matmuls():
        assert torch.equal(a @ w, torch.mm(a, w))
