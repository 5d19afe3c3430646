"""Token log-probabilities of a causal LM, computed over the vocabulary in chunks.

Only completion positions go through the LM head, in chunks recomputed in the backward pass, so
fp32 logits over a large vocabulary exist for one chunk at a time. A plain `nn.Linear` head takes
the fused head + log-softmax below; any other head takes activation
checkpointing per chunk. A micro-batch whose logits are small in all (`KEEP_LOGITS`) keeps them.

`FusedHeadLogprobs`: selected-token log-probs and entropy straight from hidden states, a fused LM
head + log-softmax.

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
(`fused_head_applies`); any other head takes the checkpoint path."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from ..generation.forward import logit_transform
from ..models.lora import decoder
from .batching import Layout, PromptShare, VarlenRows, shared_hidden
from .prefix_tree import PrefixTree, tree_hidden

# Logits up to this many elements (32 MB in fp32) are kept for the backward rather than recomputed:
# for a small vocabulary the recompute costs more time than the memory is worth.
KEEP_LOGITS = 8 << 20


def _chunk_logp(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module,
                temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float() / temperature  # (c, V)
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - logz
    with torch.no_grad():
        entropy = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def selected_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, temperature: float,
                      chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden (n, H), targets (n,) -> logp (n,) differentiable, entropy (n,) detached."""
    logps, entropies = [], []
    # At least one chunk, empty for a micro-batch with no completion token (a rank's filler): the
    # head still runs, so its gradient exists (zero) on every rank when the shards are reduced.
    recompute = torch.is_grad_enabled() and hidden.shape[0] * head.weight.shape[0] > KEEP_LOGITS
    if recompute and fused_head_applies(head):
        return fused_selected_logprobs(hidden, targets, head, temperature, chunk)
    for start in range(0, max(hidden.shape[0], 1), chunk):
        h, t = hidden[start:start + chunk], targets[start:start + chunk]
        if recompute:
            lp, ent = checkpoint(_chunk_logp, h, t, head, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_logp(h, t, head, temperature)
        logps.append(lp)
        entropies.append(ent)
    return torch.cat(logps), torch.cat(entropies)


class TransformedHead(torch.nn.Module):
    """The LM head followed by the family's logit transform (generation/forward.py's `logit_transform`), which the
    trainer, calling the head itself, must apply as ForCausalLM does. Runs on the chunked path."""

    def __init__(self, head: torch.nn.Module, divisor: float | None, cap: float | None) -> None:
        super().__init__()
        self.head, self.divisor, self.cap = head, divisor, cap

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        if self.divisor is not None:
            logits = logits / self.divisor
        return logits if self.cap is None else torch.tanh(logits / self.cap) * self.cap


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The model's LM head (`head`, below), with the model's logit transform where its family has one."""
    divisor, cap = logit_transform(getattr(model, "config", None))
    return head(model) if divisor is None and cap is None else TransformedHead(head(model), divisor, cap)


def token_logprobs(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   loss_mask: torch.Tensor, temperature: float = 1.0,
                   chunk: int = 2048, layout: Layout = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each target token input_ids[:, t+1] at masked positions: logp (b, L-1) and
    entropy (b, L-1), zero off the mask. `layout`: the same rows in the layout a micro-batch took
    (batching.py's `PromptShare` and `VarlenRows`, prefix_tree.py's `PrefixTree`), or None: padded."""
    if isinstance(layout, PrefixTree):
        # One log-prob per distinct (prefix, token) pair, then one per completion token.
        logp_pairs, ent_pairs = selected_logprobs(tree_hidden(model, layout), layout.pair_target, output_head(model),
                                                  temperature, chunk)
        return _scatter(loss_mask, logp_pairs.index_select(0, layout.pair_index),
                        ent_pairs.index_select(0, layout.pair_index))
    if isinstance(layout, VarlenRows):
        # A mask mapping, not a mask: transformers then builds no (T, T) mask for the row, which
        # the attention would ignore (models/ops.py reads the sequence bounds instead).
        none = {"full_attention": None, "sliding_attention": None}
        hidden = decoder(model)(input_ids=layout.input_ids, attention_mask=none, use_cache=False,
                                 **layout.kwargs()).last_hidden_state
        selected = hidden[0].index_select(0, layout.target_index)  # (n, H), loss_mask's order
        targets = input_ids[:, 1:][loss_mask]
    elif isinstance(layout, PromptShare):  # row-major over the targets, the same order as loss_mask's
        selected = shared_hidden(model, layout)[layout.target_mask]  # (n, H)
        targets = layout.targets[layout.target_mask]
    else:
        # No KV cache: a training forward never reads one back, and with compiled layers
        # (trainer/masters.py) each layer's cache entry would be a guard, one graph per layer.
        hidden = decoder(model)(input_ids=input_ids, attention_mask=attention_mask,
                                 use_cache=False).last_hidden_state  # (b, L, H)
        selected = hidden[:, :-1][loss_mask]  # (n, H): only positions that predict a completion token
        targets = input_ids[:, 1:][loss_mask]
    return _scatter(loss_mask, *selected_logprobs(selected, targets, output_head(model), temperature, chunk))


def _scatter(loss_mask: torch.Tensor, logp_flat: torch.Tensor,
             ent_flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n,) values in loss_mask's row-major order -> (b, L-1), zero off the mask."""
    logp = torch.zeros(loss_mask.shape, dtype=logp_flat.dtype, device=logp_flat.device)
    entropy = torch.zeros_like(logp, requires_grad=False)
    return logp.masked_scatter(loss_mask, logp_flat), entropy.masked_scatter(loss_mask, ent_flat)


class TokenLogprobs(torch.nn.Module):
    """`token_logprobs` of the policy as a module's forward. FSDP2 gathers a unit's parameters in its
    module's forward hooks, and `token_logprobs` never calls the causal LM's own forward: sharded,
    this module is the root unit (embeddings, final norm, head), the decoder layers units of their own."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.lm = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                temperature: float = 1.0, chunk: int = 2048,
                layout: Layout = None) -> tuple[torch.Tensor, torch.Tensor]:
        return token_logprobs(self.lm, input_ids, attention_mask, loss_mask, temperature, chunk, layout)


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


# The two halves of a causal LM the trainer calls directly (the other, `decoder`, is in models/lora.py):
# `model` and `lm_head` on Llama-shaped
# models (and lora.py's `AdaptersOff`), else transformers' `base_model` and `get_output_embeddings()`
# (GPT-NeoX's `gpt_neox` and `embed_out`), so a model on the HF fallback trains through the same code.
def head(model: Any) -> torch.nn.Module:
    return model.lm_head if hasattr(model, "lm_head") else model.get_output_embeddings()
