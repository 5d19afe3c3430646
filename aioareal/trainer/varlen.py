"""A micro-batch's sequences concatenated into one row, for variable-length attention.

The real tokens go through the model as one row (1, T), positions restarting at 0 per sequence,
with `cu_seqlens` passed to the attention as transformers' `cu_seq_lens_q/k` and `max_length_q/k`;
models/attention.py attends within each sequence (a varlen flash kernel on CUDA, a block-diagonal
mask elsewhere), so no FLOPs go to padding. Built on the host: `target_index` picks the position
predicting each completion token, in `loss_mask`'s order, so the loss is unchanged.

Used where shared prompts are not (trainer/trainer.py `_choose_layouts`): computing each prompt
once saves more than dropping padding does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError
from ..group import Sample
from ..models.attention import ATTENTION, varlen_kernel_available


@dataclass
class VarlenRows:
    input_ids: torch.Tensor  # (1, T) long: the sequences back to back
    position_ids: torch.Tensor  # (1, T) long: 0 .. len-1 for each sequence
    cu_seqlens: torch.Tensor  # (n + 1,) int32: where each sequence starts; the last entry is T
    max_len: int  # longest sequence (a host int: the varlen kernel needs it without a sync)
    target_index: torch.Tensor  # (targets,) long: positions in the row predicting each completion token

    def kwargs(self) -> dict:
        """What the model's forward passes on to the attention function."""
        return dict(position_ids=self.position_ids, cu_seq_lens_q=self.cu_seqlens, cu_seq_lens_k=self.cu_seqlens,
                    max_length_q=self.max_len, max_length_k=self.max_len)


def build_varlen(samples: list[Sample]) -> VarlenRows:
    """The one-row layout of these samples (CPU tensors; `varlen_to` moves them)."""
    ids: list[int] = []
    positions: list[int] = []
    starts = [0]
    targets: list[int] = []
    for s in samples:
        row = s.prompt_ids + s.tokens
        start = len(ids)
        ids.extend(row)
        positions.extend(range(len(row)))
        starts.append(len(ids))
        first = start + len(s.prompt_ids) - 1  # position t predicts token t + 1
        model = s.completion.model_mask()  # episodes: observation tokens are no target
        targets.extend(range(first, first + len(s.tokens)) if model is None
                       else (first + j for j, m in enumerate(model) if m))
    return VarlenRows(torch.tensor([ids], dtype=torch.long), torch.tensor([positions], dtype=torch.long),
                      torch.tensor(starts, dtype=torch.int32),
                      max(len(s.prompt_ids) + len(s.tokens) for s in samples), torch.tensor(targets, dtype=torch.long))


def varlen_to(rows: VarlenRows, device: torch.device) -> VarlenRows:
    put = dict(device=device, non_blocking=True)
    return VarlenRows(rows.input_ids.to(**put), rows.position_ids.to(**put), rows.cu_seqlens.to(**put),
                      rows.max_len, rows.target_index.to(**put))


def use_varlen(setting: bool | str, device: torch.device, model: torch.nn.Module) -> bool:
    """train.varlen (true, false or "auto") -> whether micro-batches take the one-row layout. It needs
    the project's attention ("aioareal"), which reads the sequence bounds: any other attends across."""
    attention = getattr(model.config, "_attn_implementation", None)
    if setting == "auto":
        return varlen_kernel_available(device) and attention == ATTENTION == "aioareal"
    if setting and attention != "aioareal":
        raise UserError(f"train.varlen=true needs the model's attention implementation 'aioareal' (models load "
                        f"with it on transformers >= 4.53), but it is {attention!r}; set train.varlen=false")
    return bool(setting)
