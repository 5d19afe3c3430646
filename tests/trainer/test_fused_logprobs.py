"""The fused LM head + log-softmax (trainer/logprobs.py) against the checkpointed head it
replaces: gradcheck in float64, equal values and gradients in fp32 (tied and untied heads, a bias,
an empty filler micro-batch), autocast, and which heads fall back to the checkpoint path."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import aioareal.trainer.logprobs as logprobs
from aioareal.trainer.logprobs import FusedHeadLogprobs, fused_head_applies, fused_selected_logprobs


def _inputs(n: int, hidden: int, vocab: int, dtype: torch.dtype, seed: int = 0, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=gen, dtype=dtype).requires_grad_()
    head = nn.Linear(hidden, vocab, bias=bias, dtype=dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=gen, dtype=dtype))
        if bias:
            head.bias.copy_(torch.randn(vocab, generator=gen, dtype=dtype))
    targets = torch.randint(0, vocab, (n,), generator=gen)
    weights = torch.randn(n, generator=gen)  # the loss's per-token weights: a non-uniform upstream gradient
    return h, head, targets, weights


def _checkpointed(h, targets, head, temperature, chunk, monkeypatch):
    """The path the fused one replaces: activation checkpointing per chunk (forced for any size)."""
    monkeypatch.setattr(logprobs, "KEEP_LOGITS", -1)
    monkeypatch.setattr(logprobs, "fused_head_applies", lambda head: False)
    return logprobs.selected_logprobs(h, targets, head, temperature, chunk)


@pytest.mark.parametrize("bias", [False, True])
def test_gradcheck_in_float64(bias):
    h, head, targets, _ = _inputs(5, 4, 7, torch.float64, bias=bias)
    params = (h, head.weight.detach().requires_grad_(), head.bias.detach().requires_grad_() if bias else None)
    fn = lambda x, w, b: FusedHeadLogprobs.apply(x, w, b, targets, 0.7, 2)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, params)


@pytest.mark.parametrize("n,chunk,bias,temperature", [(13, 4, False, 0.7), (8, 8, True, 1.0), (6, 100, False, 1.3)])
def test_values_and_gradients_equal_the_checkpoint_path_in_fp32(n, chunk, bias, temperature, monkeypatch):
    results = []
    for path in ("fused", "checkpoint"):
        h, head, targets, weights = _inputs(n, 16, 50, torch.float32, bias=bias)
        if path == "fused":
            logp, entropy = fused_selected_logprobs(h, targets, head, temperature, chunk)
        else:
            logp, entropy = _checkpointed(h, targets, head, temperature, chunk, monkeypatch)
        params = [h, *head.parameters()]
        results.append((logp, entropy, torch.autograd.grad((logp * weights).sum(), params)))
    (logp, entropy, grads), (ref_logp, ref_entropy, ref_grads) = results
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    assert not entropy.requires_grad and len(grads) == (3 if bias else 2)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, atol=1e-5, rtol=1e-4)


def test_a_tied_head_gets_both_gradients_through_the_fused_path(monkeypatch):
    """Tied embeddings: the head's weight is the embedding's, used before the head too."""
    monkeypatch.setattr(logprobs, "KEEP_LOGITS", -1)
    results = []
    for use_fused in (True, False):
        monkeypatch.setattr(logprobs, "fused_head_applies", lambda head, f=use_fused: f)
        torch.manual_seed(0)
        embed = nn.Embedding(40, 12)
        head = nn.Linear(12, 40, bias=False)
        head.weight = embed.weight
        ids = torch.randint(0, 40, (9,))
        h = torch.tanh(embed(ids))  # (9, 12): the "model" before the head
        logp, _ = logprobs.selected_logprobs(h, ids.roll(1), head, 0.9, 4)
        results.append(torch.autograd.grad(logp.sum(), embed.weight)[0])
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-4)


def test_an_empty_micro_batch_still_gives_the_head_a_zero_gradient():
    """A rank's filler micro-batch has no completion token; its head gradient must exist as zeros."""
    h, head, targets, _ = _inputs(0, 8, 20, torch.float32, bias=True)
    logp, entropy = fused_selected_logprobs(h, targets, head, 0.7, 4)
    assert logp.shape == entropy.shape == (0,)
    logp.sum().backward()
    assert head.weight.grad is not None and head.bias.grad is not None and h.grad is not None
    assert (head.weight.grad == 0).all() and (head.bias.grad == 0).all() and h.grad.shape == (0, 8)


def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_do():
    """LoRA freezes the head: only grad_h is formed."""
    h, head, targets, weights = _inputs(7, 8, 20, torch.float32)
    head.requires_grad_(False)
    logp, _ = fused_selected_logprobs(h, targets, head, 1.0, 3)
    (logp * weights).sum().backward()
    assert head.weight.grad is None and h.grad is not None and h.grad.abs().sum() > 0


def test_under_autocast_the_matmuls_run_in_its_dtype_as_the_checkpoint_path(monkeypatch):
    results = []
    for path in ("fused", "checkpoint"):
        h, head, targets, weights = _inputs(10, 32, 64, torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if path == "fused":
                logp, entropy = fused_selected_logprobs(h, targets, head, 0.7, 4)
            else:
                logp, entropy = _checkpointed(h, targets, head, 0.7, 4, monkeypatch)
            grads = torch.autograd.grad((logp * weights).sum(), [h, head.weight])
        results.append((logp, entropy, grads))
    (logp, entropy, grads), (ref_logp, ref_entropy, ref_grads) = results
    assert logp.dtype == torch.float32 and grads[1].dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp)  # same bf16 matmul, same fp32 softmax: equal to rounding
    torch.testing.assert_close(entropy, ref_entropy)
    for g, ref in zip(grads, ref_grads):  # the reference sums W's chunks in bf16, the fused path in fp32
        torch.testing.assert_close(g, ref, atol=2e-2, rtol=2e-2)
    # Both differ from the fp32 gradients by bf16 rounding, i.e. autocast did apply.
    h, head, targets, weights = _inputs(10, 32, 64, torch.float32)
    logp32, _ = fused_selected_logprobs(h, targets, head, 0.7, 4)
    assert not torch.equal(logp32, logp)


class _Hooked(nn.Linear):
    pass


def test_only_a_plain_linear_head_takes_the_fused_path():
    assert fused_head_applies(nn.Linear(4, 8))
    assert not fused_head_applies(_Hooked(4, 8))  # a subclass (FSDP2's FSDPLinear, quantised heads)
    hooked = nn.Linear(4, 8)
    hooked.register_forward_pre_hook(lambda module, args: None)
    assert not fused_head_applies(hooked)


def test_a_peft_wrapped_head_falls_back_to_the_checkpoint_path():
    peft = pytest.importorskip("peft")
    model = nn.Sequential()
    model.add_module("lm_head", nn.Linear(4, 8, bias=False))
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["lm_head"]))
    head = wrapped.base_model.model.lm_head
    assert not fused_head_applies(head)


def test_a_dtensor_head_falls_back_to_the_checkpoint_path(monkeypatch):
    """A DTensor weight (a head sharded by FSDP2 outside its unit's forward) is not a plain tensor."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        head = nn.Linear(4, 8, bias=False)
        mesh = init_device_mesh("cpu", (1,))
        head.weight = nn.Parameter(distribute_tensor(head.weight.detach(), mesh, [Replicate()]))
        assert not fused_head_applies(head)
    finally:
        dist.destroy_process_group()


def test_selected_logprobs_takes_the_fused_path_only_for_large_logits_with_grad(monkeypatch):
    calls, fused_path = [], logprobs.fused_selected_logprobs
    monkeypatch.setattr(logprobs, "fused_selected_logprobs", lambda *args: calls.append(1) or fused_path(*args))
    h, head, targets, _ = _inputs(6, 8, 20, torch.float32)
    logprobs.selected_logprobs(h, targets, head, 1.0, 4)  # 120 logits: kept
    assert calls == []
    monkeypatch.setattr(logprobs, "KEEP_LOGITS", 100)
    logprobs.selected_logprobs(h, targets, head, 1.0, 4)
    assert calls == [1]
    with torch.no_grad():  # no backward: plain chunks, nothing to save
        logprobs.selected_logprobs(h, targets, head, 1.0, 4)
    assert calls == [1]


@pytest.mark.gpu
def test_on_cuda_under_bf16_autocast_the_fused_path_equals_the_checkpoint_path(monkeypatch):
    results = []
    for path in ("fused", "checkpoint"):
        h, head, targets, weights = _inputs(3000, 256, 4096, torch.float32)
        h, head = h.detach().cuda().requires_grad_(), head.cuda()
        targets, weights = targets.cuda(), weights.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if path == "fused":
                logp, entropy = fused_selected_logprobs(h, targets, head, 0.7, 1024)
            else:
                logp, entropy = _checkpointed(h, targets, head, 0.7, 1024, monkeypatch)
            grads = torch.autograd.grad((logp * weights).sum(), [h, head.weight])
        results.append((logp, entropy, grads))
    (logp, entropy, grads), (ref_logp, ref_entropy, ref_grads) = results
    torch.testing.assert_close(logp, ref_logp, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-3, rtol=1e-3)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, atol=3e-2, rtol=3e-2)
