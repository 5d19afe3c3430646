"""Selected-token log-probs and entropy straight from hidden states: a fused LM head + log-softmax.

`FusedHeadLogprobs` is one autograd node for the whole micro-batch. Its forward runs the head in
chunks of tokens, logits = (h @ W^T + b) / T in fp32 for one chunk at a time, and keeps per token
only the log-sum-exp; the backward recomputes each chunk's logits and forms the gradients by hand:

    dL/dlogits = g * (onehot(target) - softmax(logits)) / T          (c, V), fp32
    grad_h = dL/dlogits @ W,   grad_W += dL/dlogits^T @ h,   grad_b += sum_tokens dL/dlogits

so full-vocabulary logits never exist for more than one chunk, and nothing is saved but h, W, b,
the targets and the (n,) log-sum-exp. Against checkpointing the head it saves the second forward,
each chunk's autograd graph and its (c, V) temporaries. grad_W and grad_b sum in fp32.

Autocast is applied by hand, the same in both passes: the matmuls in the autocast dtype, as
`nn.Linear` would, everything after them in fp32, as `head(h).float()`. It reads the head's weight
directly, so it applies only to a plain `nn.Linear` with plain tensors and no hooks
(`fused_head_applies`); any other head takes the checkpoint path.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def fused_head_applies(head: nn.Module) -> bool:
    """Whether `head` is what the fused path computes: exactly `nn.Linear` (not a peft wrapper, not
    FSDP2's `FSDPLinear`), no hooks, plain-tensor parameters. Under FSDP2 the root unit's forward has
    swapped in the unsharded weight by the time this is asked."""
    if type(head) is not nn.Linear or head._forward_hooks or head._forward_pre_hooks:
        return False
    return not any(isinstance(p, DTensor) for p in (head.weight, head.bias) if p is not None)


def fused_selected_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: nn.Linear, temperature: float,
                            chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden (n, H), targets (n,) -> logp (n,) fp32 differentiable, entropy (n,) fp32 detached."""
    return FusedHeadLogprobs.apply(hidden, head.weight, head.bias, targets, temperature, chunk)


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The matmul dtype `nn.Linear` would use: the autocast dtype (float64 aside), else the inputs'."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device) and torch.float64 not in (hidden.dtype, weight.dtype):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 after the matmul, as `head(h).float()` (float64 stays float64, for gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  temperature: float) -> torch.Tensor:
    """(c, H) -> (c, V) fp32 logits / T, the matmul in the dtype `weight` already has."""
    logits = nn.functional.linear(h.to(weight.dtype), weight, bias).to(_accumulation_dtype(weight.dtype))
    return logits.div_(temperature) if temperature != 1.0 else logits


class FusedHeadLogprobs(torch.autograd.Function):
    """logp, entropy = log_softmax(head(h) / T)[target], H(softmax(head(h) / T)), chunked."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,  # type: ignore[override]
                targets: torch.Tensor, temperature: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = _compute_dtype(hidden, weight)
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=_accumulation_dtype(dtype))
        entropy = torch.empty_like(logp)
        lse = torch.empty_like(logp)
        with _no_autocast(hidden):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)  # one cast for all chunks
            for start in range(0, n, chunk):
                end = min(start + chunk, n)
                logits = _chunk_logits(hidden[start:end], w, b, temperature)  # (c, V) fp32
                lse[start:end], entropy[start:end] = _lse_entropy(logits)
                logp[start:end] = logits.gather(-1, targets[start:end, None]).squeeze(-1) - lse[start:end]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor | None):  # type: ignore[override]
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        temperature, chunk = ctx.temperature, ctx.chunk
        grad_h = torch.empty_like(hidden) if need_h else None
        # An empty micro-batch (a rank's filler) still returns zeros for W: FSDP reduces every shard.
        acc = _accumulation_dtype(ctx.dtype)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        with _no_autocast(hidden):
            w, b = weight.to(ctx.dtype), None if bias is None else bias.to(ctx.dtype)
            for start in range(0, hidden.shape[0], chunk):
                end = min(start + chunk, hidden.shape[0])
                h = hidden[start:end].to(ctx.dtype)
                g = grad_logp[start:end].to(acc)
                # softmax from the saved log-sum-exp, in place over the recomputed logits (one (c, V) buffer)
                dlogits = _chunk_logits(h, w, b, temperature).sub_(lse[start:end, None]).exp_()
                dlogits.mul_(-g[:, None] / temperature)  # -g * p / T
                dlogits.scatter_add_(-1, targets[start:end, None], (g / temperature)[:, None])  # + g * onehot / T
                if grad_b is not None:
                    grad_b += dlogits.sum(0)
                dl = dlogits.to(ctx.dtype)  # (c, V): the matmuls run in the forward's dtype
                if grad_h is not None:
                    grad_h[start:end] = dl @ w
                if grad_w is not None:
                    _accumulate(grad_w, dl.T, h)
        return (grad_h, _cast(grad_w, weight), _cast(grad_b, bias), None, None, None)


def _lse_entropy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c, V) -> log-sum-exp and entropy per row from one exp pass: with e = exp(logits - max) and
    s = sum(e), lse = max + log s and H = lse - sum(e * logits) / s."""
    top = logits.amax(dim=-1, keepdim=True)
    e = (logits - top).exp_()
    total = e.sum(dim=-1)
    lse = top.squeeze(-1) + total.log()
    return lse, lse - torch.linalg.vecdot(e, logits) / total


def _accumulate(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """total (fp32) += a @ b: in place when a and b share its dtype, else the product in theirs, added in fp32."""
    if a.dtype == total.dtype:
        total.addmm_(a, b)
    else:
        total += (a @ b).to(total.dtype)


def _cast(grad: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor | None:
    return None if grad is None or like is None else grad.to(like.dtype)


def _no_autocast(t: torch.Tensor):
    """Autocast off for the body: the casts are explicit (the module docstring)."""
    device = t.device.type
    return torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else nullcontext()


# The two halves of a causal LM the trainer calls directly: `model` and `lm_head` on Llama-shaped
# models (and lora.py's `AdaptersOff`), else transformers' `base_model` and `get_output_embeddings()`
# (GPT-NeoX's `gpt_neox` and `embed_out`), so a model on the HF fallback trains through the same code.
def decoder(model: Any) -> Any:
    """What maps input ids to the last hidden states (a module, or AdaptersOff's `model` method)."""
    return model.model if hasattr(model, "model") else model.base_model


def head(model: Any) -> torch.nn.Module:
    return model.lm_head if hasattr(model, "lm_head") else model.get_output_embeddings()
