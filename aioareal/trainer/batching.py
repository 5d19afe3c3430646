"""Pack samples into micro-batches by a token budget (which rows go together: `plan_for`), each
with the layout its log-probs are computed in: the prefix tree, shared prompts, one varlen row, or
the padded rows alone (whose padding is reported as `padding_frac`).

**Varlen** (`VarlenRows`): a micro-batch's sequences concatenated into one row, for variable-length
attention.

The real tokens go through the model as one row (1, T), positions restarting at 0 per sequence,
with `cu_seqlens` passed to the attention as transformers' `cu_seq_lens_q/k` and `max_length_q/k`;
models/ops.py attends within each sequence (a varlen flash kernel on CUDA, a block-diagonal
mask elsewhere), so no FLOPs go to padding. Built on the host: `target_index` picks the position
predicting each completion token, in `loss_mask`'s order, so the loss is unchanged.

Used where shared prompts are not (trainer/trainer.py `_choose_layouts`): computing each prompt
once saves more than dropping padding does.

**Shared prompts** (`PromptShare`): a micro-batch's prompts computed once and shared by the rows that
continue them.

A padded micro-batch computes a group's prompt G times. With `PromptShare` the distinct prompts go through the
model once (their KV cache kept in the autograd graph), the caches are gathered to the rows, and
only the completions go through a second pass. Log-probs and gradients are the padded path's up to
rounding: the prompt's share adds up over its rows in the gather's backward.

Layout, for row i with prompt p_i (length P_i) and completion c_i (length n_i):
  prompts (g, P) right-padded, the distinct prompts; `row_prompt` (b,) picks row i's;
  inputs (b, C): c_i[:-1] right-padded, at positions P_i .. P_i + n_i - 2;
  targets (b, C + 1): c_i, predicted by p_i's last position and then by each input in turn;
    `target_mask` keeps the model's tokens only (an episode's observation tokens are inputs, with
    `input_mask` set, but predict nothing: no loss term).

**Planning**: which samples share a micro-batch, the cuts of a batch under the token budget. Padded
rows are cut by length (`plan`): rows of similar length pad little. Where prompts are shared a
micro-batch computes each distinct prompt once, so `plan_shared` keeps a group's rows together where
that computes less.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..errors import UserError
from ..group import Sample
from ..models.lora import decoder
from ..models.ops import ATTENTION, varlen_kernel_available
from .prefix_tree import Plan, PrefixTree, TreeSetting, build_tree, tree_to, worthwhile_plan


# -- planning: which rows go together, in which layout ------------------------------------------------
@dataclass(frozen=True)
class Layouts:
    """The layouts a trainer's micro-batches may take, chosen once (trainer.py `_choose_layouts`):
    shared prompts, one varlen row where prompts are not shared, and the prefix tree (never, "auto":
    where it computes fewer positions, always). `collate` gives each micro-batch at most one."""

    share: bool = False
    varlen: bool = False
    tree: TreeSetting = False


PADDED = Layouts()  # padded rows alone


def plan(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of each micro-batch: sorted by length, rows x max_len <= budget (or one row alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def plan_shared(samples: list[Sample], budget: int, tree: TreeSetting = False) -> list[list[int]]:
    """Indices of each micro-batch for the shared-prompt layout, whose cost is the distinct prompts
    x the longest prompt + the rows x the longest completion: a group's rows should sit together,
    but unlike completion lengths pad to the longest. Two orders (by completion within each prompt,
    by length alone) are each cut where positions plus fixed costs add up least; with the prefix
    tree, which shares more the more rows it sees, each order filled to the budget is a candidate
    too. The cheapest plan wins. Rows that fit the budget together stay one micro-batch (the search
    costs host time a small step cannot spare)."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(i)
    rows_of = [sorted(rows, key=lambda i: len(samples[i].tokens)) for rows in by_prompt.values()]
    rows_of.sort(key=lambda rows: len(samples[rows[0]].prompt_ids) + len(samples[rows[-1]].tokens))
    together = [i for rows in rows_of for i in rows]
    if _shared_positions(samples, together) <= budget:
        return [together]  # all in one: nothing to save by cutting that is worth a second pass's overheads
    by_length = sorted(range(len(samples)), key=lambda i: (len(samples[i].tokens), len(samples[i].prompt_ids)))
    prompt_of = [0] * len(samples)  # each row's prompt as a small int: the search compares them often
    for k, rows in enumerate(rows_of):
        for i in rows:
            prompt_of[i] = k
    lengths = _Lengths(prompt_of, [len(s.prompt_ids) for s in samples], [len(s.tokens) for s in samples])
    candidates = [_cheapest_cuts(lengths, order, budget) for order in (together, by_length)]
    if tree:
        candidates += [_fullest_cuts(samples, order, budget) for order in (together, by_length)]
    return min(candidates, key=lambda batches: _plan_cost(samples, batches, tree))

# A micro-batch's fixed cost (launches, per-op overheads) in token positions: it keeps `plan_shared`
# from cutting many small micro-batches for a few positions less.
MICRO_BATCH_POSITIONS = 64


def _shared_positions(samples: list[Sample], rows: list[int]) -> int:
    return layout_positions([samples[i] for i in rows], True, False)


@dataclass
class _Lengths:
    """Per row: its prompt (a small int), the prompt's length, the completion's length."""

    prompt: list[int]
    prompt_len: list[int]
    completion_len: list[int]


def _cheapest_cuts(rows: _Lengths, order: list[int], budget: int) -> list[list[int]]:
    """Micro-batches of consecutive rows of `order` within the budget whose positions plus fixed costs
    add up least: dynamic programming over where to cut."""
    n = len(order)
    best = [0] + [-1] * n  # best[j]: the least cost of order[:j]
    cut = [0] * (n + 1)  # where order[:j]'s last micro-batch starts
    for j in range(1, n + 1):
        prompts: set[int] = set()
        longest_prompt = longest_completion = 0
        for i in range(j - 1, -1, -1):  # the last micro-batch is order[i:j]
            r = order[i]
            prompts.add(rows.prompt[r])
            longest_prompt = max(longest_prompt, rows.prompt_len[r])
            longest_completion = max(longest_completion, rows.completion_len[r])
            positions = len(prompts) * longest_prompt + (j - i) * longest_completion
            if positions > budget and i < j - 1:
                break  # it only grows with more rows
            total = best[i] + positions + MICRO_BATCH_POSITIONS
            if best[j] < 0 or total < best[j]:
                best[j], cut[j] = total, i
    batches: list[list[int]] = []
    j = n
    while j > 0:
        batches.append(order[cut[j]:j])
        j = cut[j]
    return batches[::-1]


def _fullest_cuts(samples: list[Sample], order: list[int], budget: int) -> list[list[int]]:
    """Micro-batches of consecutive rows of `order`, each filled as far as the budget allows."""
    batches: list[list[int]] = []
    for i in order:
        if batches and _shared_positions(samples, batches[-1] + [i]) <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _plan_cost(samples: list[Sample], batches: list[list[int]], tree: TreeSetting) -> int:
    """The positions these micro-batches compute in the layouts `collate` takes, plus their fixed costs."""
    layouts = Layouts(share=True, tree=tree)
    return sum(taken_layout([samples[i] for i in rows], layouts)[1] + MICRO_BATCH_POSITIONS for rows in batches)


def plan_for(samples: list[Sample], budget: int, layouts: Layouts = PADDED) -> list[list[int]]:
    """The micro-batches' indices for these layouts: shared prompts kept together, or by length."""
    if layouts.share:
        return plan_shared(samples, budget, layouts.tree)
    return plan([len(s.prompt_ids) + len(s.tokens) for s in samples], budget)


def taken_layout(samples: list[Sample], layouts: Layouts) -> tuple[Plan | None, int]:
    """The prefix tree's planned rows where `collate` takes it (else None), and the taken layout's positions."""
    other = layout_positions(samples, layouts.share, layouts.varlen)
    taken = worthwhile_plan(samples, other, always=layouts.tree is True) if layouts.tree else None
    return (taken[0], taken[1]) if taken else (None, other)


def layout_positions(samples: list[Sample], share: bool, varlen: bool) -> int:
    """Positions of the layout the trainer takes when not the prefix tree (`computed_positions`, below)."""
    if share:
        prompts = {tuple(s.prompt_ids) for s in samples}
        return len(prompts) * max(map(len, prompts)) + len(samples) * max(len(s.tokens) for s in samples)
    lengths = [len(s.prompt_ids) + len(s.tokens) for s in samples]
    return sum(lengths) if varlen else len(samples) * max(lengths)


# -- the micro-batch and its layouts -----------------------------------------------------------------
@dataclass
class MicroBatch:
    """Right-padded tensors for one forward/backward. Token-level tensors are (rows, L-1), aligned
    to the *predicted* token: column t holds the target input_ids[:, t+1]."""

    input_ids: torch.Tensor  # (b, L)
    attention_mask: torch.Tensor  # (b, L)
    loss_mask: torch.Tensor  # (b, L-1) bool: target is a completion token
    behav_logp: torch.Tensor  # (b, L-1) float32, 0 off-mask
    versions: torch.Tensor  # (b, L-1) float32: policy version that sampled each target token
    advantages: torch.Tensor  # (b,) float32
    real_tokens: int  # prompt + completion tokens, padding excluded
    completion_tokens: int  # tokens the loss is computed on
    prox_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    filler: bool = False  # holds no sample: keeps this rank's micro-batch count equal to the others'
    # The same rows in the layout the log-probs are computed from, if any: each prompt computed once
    # (`PromptShare`, below), back to back in one row (`VarlenRows`, below), or each distinct prefix
    # computed once (prefix_tree.py). None: the padded rows themselves.
    layout: Layout = None
    # The mini-batch's samples set aside (`set_aside`), carried by one of its micro-batches.
    aside_rows: int = 0
    aside_tokens: int = 0

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def positions(self) -> int:
        """Token positions its forward computes in the layout it takes, padding included."""
        layout = self.layout
        if isinstance(layout, PrefixTree):
            return layout.positions
        if isinstance(layout, PromptShare):
            return layout.prompt_ids.numel() + layout.input_ids.numel()
        return self.real_tokens if isinstance(layout, VarlenRows) else self.padded_tokens

    @property
    def rows(self) -> int:
        """Sequences trained on (a filler's placeholder row is none)."""
        return 0 if self.filler else self.input_ids.shape[0]

    @classmethod
    def empty(cls, pad_id: int, device: torch.device) -> MicroBatch:
        """A filler: a row of padding with no loss token (zero loss and gradient) whose forward and
        backward take part in the sharded model's collectives."""
        zeros = torch.zeros(1, 1, device=device)
        return cls(torch.full((1, 2), pad_id, dtype=torch.long, device=device),
                   torch.ones(1, 2, dtype=torch.long, device=device),
                   torch.zeros(1, 1, dtype=torch.bool, device=device),
                   zeros, zeros.clone(), torch.zeros(1, device=device), real_tokens=0, completion_tokens=0, filler=True)

    def halves(self) -> list[MicroBatch]:
        """Split the rows in two (after an out-of-memory error); a single row stays whole."""
        b = self.input_ids.shape[0]
        if b == 1:
            return [self]
        cut = b // 2
        first = self._rows(slice(0, cut))
        first.aside_rows, first.aside_tokens = self.aside_rows, self.aside_tokens
        return [first, self._rows(slice(cut, b))]

    def _rows(self, rows: slice) -> MicroBatch:
        mask = self.loss_mask[rows]
        # Two small host syncs, only after an out-of-memory error; the halves take the padded path.
        pick = lambda t: None if t is None else t[rows]  # noqa: E731
        return MicroBatch(self.input_ids[rows], self.attention_mask[rows], mask, self.behav_logp[rows],
                          self.versions[rows], self.advantages[rows],
                          real_tokens=int(self.attention_mask[rows].sum()), completion_tokens=int(mask.sum()),
                          prox_logp=pick(self.prox_logp), ref_logp=pick(self.ref_logp))


def computed_positions(samples: list[Sample], budget: int, layouts: Layouts = PADDED) -> int:
    """Token positions the forward computes for these samples, padding included, in the layouts
    `collate` takes: a step's cost follows this, not the real tokens."""
    return sum(taken_layout([samples[i] for i in idx], layouts)[1] for idx in plan_for(samples, budget, layouts))


def collate(samples: list[Sample], pad_id: int, device: torch.device, layouts: Layouts = PADDED) -> MicroBatch:
    """One micro-batch of these samples: the padded tensors (which the loss reads) and at most one
    layout the log-probs are computed from: the prefix tree (`layouts.tree`: always, or "auto" where
    it pays), else shared prompts (`share`), else one row (`varlen`)."""
    rows = [s.prompt_ids + s.tokens for s in samples]
    width = max(len(r) for r in rows)
    # Padded Python rows, then one tensor each: a per-row tensor copy costs more than the row.
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    attn = (torch.arange(width)[None, :] < lengths[:, None]).long()
    before = [[0.0] * (len(s.prompt_ids) - 1) for s in samples]  # targets that are prompt tokens
    after = [[0.0] * (width - len(r)) for r in rows]  # padding
    shape = (len(rows), width - 1)
    # Episodes: observation tokens are targets of no loss term (docs/architecture.md rule 9); None: all the model's.
    models = [s.completion.model_mask() for s in samples]
    mask = torch.tensor([[False] * len(b) + ([True] * len(s.tokens) if m is None else m) + [False] * len(a)
                         for s, b, a, m in zip(samples, before, after, models)], dtype=torch.bool).reshape(shape)
    behav = torch.tensor([b + _model_logprobs(s, m) + a for s, b, a, m in zip(samples, before, after, models)],
                         dtype=torch.float32).reshape(shape)
    versions = torch.tensor([b + [float(v) for v in s.completion.versions] + a
                             for s, b, a in zip(samples, before, after)], dtype=torch.float32).reshape(shape)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    put = dict(device=device, non_blocking=True)
    planned, _ = taken_layout(samples, layouts)
    layout = (tree_to(build_tree(samples, pad_id, planned=planned), device) if planned is not None
              else share_to(build_share(samples, pad_id), device) if layouts.share
              else varlen_to(build_varlen(samples), device) if layouts.varlen else None)
    return MicroBatch(ids.to(**put), attn.to(**put), mask.to(**put), behav.to(**put), versions.to(**put),
                      adv.to(**put), real_tokens=sum(len(r) for r in rows),
                      completion_tokens=sum(len(s.tokens) if m is None else sum(m) for s, m in zip(samples, models)),
                      layout=layout)


def _model_logprobs(sample: Sample, model: list[bool] | None) -> list[float]:
    """The behaviour log-probs, 0 at observation positions: their NaN placeholders must not reach a
    tensor that is multiplied by the mask (NaN * 0 is NaN)."""
    logprobs = sample.completion.logprobs
    return logprobs if model is None else [lp if m else 0.0 for lp, m in zip(logprobs, model)]


def pack(samples: list[Sample], budget: int, pad_id: int, device: torch.device,
         layouts: Layouts = PADDED) -> list[MicroBatch]:
    return [collate([samples[i] for i in idx], pad_id, device, layouts) for idx in plan_for(samples, budget, layouts)]


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
    """The shared layout of these samples (CPU tensors; `share_to` moves them)."""
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


Layout = PromptShare | VarlenRows | PrefixTree | None  # a micro-batch's `layout`: one of these, or padded
