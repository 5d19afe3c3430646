"""Token log-probabilities of a causal LM, computed over the vocabulary in chunks.

Only completion positions go through the LM head, in chunks recomputed in the backward pass, so
fp32 logits over a large vocabulary exist for one chunk at a time. A plain `nn.Linear` head takes
the fused head + log-softmax (trainer/fused_logprobs.py); any other head takes activation
checkpointing per chunk. A micro-batch whose logits are small in all (`KEEP_LOGITS`) keeps them.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from ..generation.families import logit_transform
from .fused_logprobs import decoder, fused_head_applies, fused_selected_logprobs, head
from .prefix_tree import PrefixTree, tree_hidden
from .shared_prompts import PromptShare, shared_hidden
from .varlen import VarlenRows

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
    """The LM head followed by the family's logit transform (families.logit_transform), which the
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
    """The model's LM head (fused_logprobs.head), with the model's logit transform where its family has one."""
    divisor, cap = logit_transform(getattr(model, "config", None))
    return head(model) if divisor is None and cap is None else TransformedHead(head(model), divisor, cap)


def token_logprobs(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   loss_mask: torch.Tensor, temperature: float = 1.0,
                   chunk: int = 2048, share: PromptShare | None = None,
                   varlen: VarlenRows | None = None,
                   tree: PrefixTree | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each target token input_ids[:, t+1] at masked positions: logp (b, L-1) and
    entropy (b, L-1), zero off the mask. `share`, `varlen` or `tree`: the same rows in that layout
    (shared_prompts.py, varlen.py, prefix_tree.py)."""
    if tree is not None:
        # One log-prob per distinct (prefix, token) pair, then one per completion token.
        logp_pairs, ent_pairs = selected_logprobs(tree_hidden(model, tree), tree.pair_target, output_head(model),
                                                  temperature, chunk)
        return _scatter(loss_mask, logp_pairs.index_select(0, tree.pair_index),
                        ent_pairs.index_select(0, tree.pair_index))
    if varlen is not None:
        # A mask mapping, not a mask: transformers then builds no (T, T) mask for the row, which
        # the attention would ignore (models/attention.py reads the sequence bounds instead).
        none = {"full_attention": None, "sliding_attention": None}
        hidden = decoder(model)(input_ids=varlen.input_ids, attention_mask=none, use_cache=False,
                                 **varlen.kwargs()).last_hidden_state
        selected = hidden[0].index_select(0, varlen.target_index)  # (n, H), loss_mask's order
        targets = input_ids[:, 1:][loss_mask]
    elif share is None:
        # No KV cache: a training forward never reads one back, and with compiled layers
        # (trainer/masters.py) each layer's cache entry would be a guard, one graph per layer.
        hidden = decoder(model)(input_ids=input_ids, attention_mask=attention_mask,
                                 use_cache=False).last_hidden_state  # (b, L, H)
        selected = hidden[:, :-1][loss_mask]  # (n, H): only positions that predict a completion token
        targets = input_ids[:, 1:][loss_mask]
    else:  # row-major over the targets, the same order as loss_mask's
        selected = shared_hidden(model, share)[share.target_mask]  # (n, H)
        targets = share.targets[share.target_mask]
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
                temperature: float = 1.0, chunk: int = 2048, share: PromptShare | None = None,
                varlen: VarlenRows | None = None, tree: PrefixTree | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return token_logprobs(self.lm, input_ids, attention_mask, loss_mask, temperature, chunk, share, varlen, tree)
