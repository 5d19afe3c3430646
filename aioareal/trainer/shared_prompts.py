"""A micro-batch's prompts computed once and shared by the rows that continue them.

A padded micro-batch computes a group's prompt G times. Here the distinct prompts go through the
model once (their KV cache kept in the autograd graph), the caches are gathered to the rows, and
only the completions go through a second pass. Log-probs and gradients are the padded path's up to
rounding: the prompt's share adds up over its rows in the gather's backward.

Layout, for row i with prompt p_i (length P_i) and completion c_i (length n_i):
  prompts (g, P) right-padded, the distinct prompts; `row_prompt` (b,) picks row i's;
  inputs (b, C): c_i[:-1] right-padded, at positions P_i .. P_i + n_i - 2;
  targets (b, C + 1): c_i, predicted by p_i's last position and then by each input in turn;
    `target_mask` keeps the model's tokens only (an episode's observation tokens are inputs, with
    `input_mask` set, but predict nothing: no loss term).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..group import Sample
from .fused_logprobs import decoder


@dataclass
class PromptShare:
    prompt_ids: torch.Tensor  # (g, P) long, right-padded
    prompt_mask: torch.Tensor  # (g, P) long
    row_prompt: torch.Tensor  # (b,) long: row -> its prompt
    prompt_len: torch.Tensor  # (b,) long
    input_ids: torch.Tensor  # (b, C) long: each completion but its last token, right-padded
    input_mask: torch.Tensor  # (b, C) long
    targets: torch.Tensor  # (b, C + 1) long: each completion, right-padded
    target_mask: torch.Tensor  # (b, C + 1) bool


def build_share(samples: list[Sample], pad_id: int) -> PromptShare:
    """The shared layout of these samples (CPU tensors; `to` moves them)."""
    index: dict[tuple[int, ...], int] = {}
    for s in samples:
        index.setdefault(tuple(s.prompt_ids), len(index))
    prompts = list(index)
    row_prompt = [index[tuple(s.prompt_ids)] for s in samples]
    p_width = max(len(p) for p in prompts)
    c_width = max(len(s.tokens) for s in samples)
    prompt_ids = torch.tensor([list(p) + [pad_id] * (p_width - len(p)) for p in prompts], dtype=torch.long)
    prompt_mask = torch.tensor([[1] * len(p) + [0] * (p_width - len(p)) for p in prompts], dtype=torch.long)
    targets = torch.tensor([s.tokens + [pad_id] * (c_width - len(s.tokens)) for s in samples], dtype=torch.long)
    lengths = torch.tensor([len(s.tokens) for s in samples])
    present = torch.arange(c_width)[None, :] < lengths[:, None]  # (b, C + 1): a token, not padding
    target_mask = present & _model_tokens(samples, c_width)
    return PromptShare(prompt_ids, prompt_mask, torch.tensor(row_prompt, dtype=torch.long),
                       torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.long),
                       targets[:, :-1], present[:, 1:].long(), targets, target_mask)


def _model_tokens(samples: list[Sample], width: int) -> torch.Tensor:
    """(b, width) bool: False at episodes' observation tokens (inputs, never targets), else True."""
    models = [s.completion.model_mask() for s in samples]
    if all(m is None for m in models):
        return torch.ones(1, width, dtype=torch.bool)
    return torch.tensor([(m or [True] * len(s.tokens)) + [True] * (width - len(s.tokens))
                         for s, m in zip(samples, models)], dtype=torch.bool)


def share_to(share: PromptShare, device: torch.device) -> PromptShare:
    put = dict(device=device, non_blocking=True)
    return PromptShare(*(getattr(share, f).to(**put) for f in PromptShare.__dataclass_fields__))


def shared_hidden(model: PreTrainedModel, share: PromptShare) -> torch.Tensor:
    """Hidden states at the positions that predict each target: (b, C + 1, H)."""
    out = decoder(model)(input_ids=share.prompt_ids, attention_mask=share.prompt_mask, use_cache=True)
    hidden = out.last_hidden_state  # (g, P, H)
    # The last prompt position predicts the first completion token. Taken once per prompt, then
    # index_select to its rows: a repeated index's backward adds with atomics on several CPU threads
    # (another float sum each run; sync-mode runs must replay exactly).
    ends = (share.prompt_mask.sum(dim=1) - 1)[:, None, None].expand(-1, 1, hidden.shape[-1])  # (g, 1, H)
    last = hidden.gather(1, ends).squeeze(1).index_select(0, share.row_prompt)  # (b, H)
    width = share.input_ids.shape[1]
    if width == 0:  # every completion is one token long
        return last[:, None]
    # transformers 5.24 renamed `past_key_values` -> `cache` (the old name warns on each call).
    cache_name = "cache" if hasattr(out, "cache") else "past_key_values"
    cache = getattr(out, cache_name)
    cache.reorder_cache(share.row_prompt)  # (g, ...) -> (b, ...): index_select, in the autograd graph
    mask = torch.cat([share.prompt_mask[share.row_prompt], share.input_mask], dim=1)  # (b, P + C)
    steps = torch.arange(width, device=share.prompt_len.device)
    positions = share.prompt_len[:, None] + steps[None, :]  # (b, C): each row continues its own prompt
    rest = decoder(model)(input_ids=share.input_ids, attention_mask=mask, position_ids=positions,
                           use_cache=True, **{cache_name: cache}).last_hidden_state  # (b, C, H)
    return torch.cat([last[:, None], rest], dim=1)
