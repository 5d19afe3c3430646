"""Pack samples into micro-batches by a token budget (which rows go together: planning.py), each
with the layout its log-probs are computed in: the prefix tree, shared prompts, one varlen row, or
the padded rows alone (whose padding is reported as `padding_frac`).

Samples of zero advantage carry no gradient: with train.skip_zero_advantage `set_aside` keeps them
out of the computed micro-batches, while they still count in the loss's normalisers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..group import Sample
from .planning import plan_for, taken_layout
from .prefix_tree import PrefixTree, TreeSetting, build_tree, tree_to
from .shared_prompts import PromptShare, build_share, share_to
from .varlen import VarlenRows, build_varlen, varlen_to


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
    share: PromptShare | None = None  # the same rows with each prompt computed once (shared_prompts.py)
    varlen: VarlenRows | None = None  # the same rows back to back in one row, no padding (varlen.py)
    tree: PrefixTree | None = None  # the same rows with each distinct prefix computed once (prefix_tree.py)
    # The mini-batch's samples set aside (`set_aside`), carried by one of its micro-batches.
    aside_rows: int = 0
    aside_tokens: int = 0

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def positions(self) -> int:
        """Token positions its forward computes in the layout it takes, padding included."""
        if self.tree is not None:
            return self.tree.positions
        if self.share is not None:
            return self.share.prompt_ids.numel() + self.share.input_ids.numel()
        return self.real_tokens if self.varlen is not None else self.padded_tokens

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


def computed_positions(samples: list[Sample], budget: int, share: bool, tree: TreeSetting = False,
                       varlen: bool = False) -> int:
    """Token positions the forward computes for these samples, padding included, in the layouts
    `collate` takes: a step's cost follows this, not the real tokens."""
    return sum(taken_layout([samples[i] for i in idx], share, varlen, tree)[1]
               for idx in plan_for(samples, budget, share, tree))


def collate(samples: list[Sample], pad_id: int, device: torch.device, share: bool = False,
            varlen: bool = False, tree: TreeSetting = False) -> MicroBatch:
    """One micro-batch of these samples: the padded tensors (which the loss reads) and at most one
    layout the log-probs are computed from: the prefix tree (`tree`: always, or "auto" where it pays),
    else with `share` shared prompts, else with `varlen` one row."""
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
    planned, _ = taken_layout(samples, share, varlen, tree)
    prefix_tree = build_tree(samples, pad_id, planned=planned) if planned is not None else None
    return MicroBatch(ids.to(**put), attn.to(**put), mask.to(**put), behav.to(**put), versions.to(**put),
                      adv.to(**put), real_tokens=sum(len(r) for r in rows),
                      completion_tokens=sum(len(s.tokens) if m is None else sum(m) for s, m in zip(samples, models)),
                      share=share_to(build_share(samples, pad_id), device) if share and not prefix_tree else None,
                      varlen=(varlen_to(build_varlen(samples), device) if varlen and not share and not prefix_tree
                              else None),
                      tree=tree_to(prefix_tree, device) if prefix_tree else None)


def _model_logprobs(sample: Sample, model: list[bool] | None) -> list[float]:
    """The behaviour log-probs, 0 at observation positions: their NaN placeholders must not reach a
    tensor that is multiplied by the mask (NaN * 0 is NaN)."""
    logprobs = sample.completion.logprobs
    return logprobs if model is None else [lp if m else 0.0 for lp, m in zip(logprobs, model)]


def pack(samples: list[Sample], budget: int, pad_id: int, device: torch.device,
         share: bool = False, varlen: bool = False, tree: TreeSetting = False) -> list[MicroBatch]:
    return [collate([samples[i] for i in idx], pad_id, device, share, varlen, tree)
            for idx in plan_for(samples, budget, share, tree)]


# -- zero_advantage ----------------------------------------------------------------------------------
# A sample of advantage exactly zero adds exactly zero to every objective's gradient (unless a KL
# penalty pulls it), and GRPO gives many (every group whose rewards are all equal). They are set aside
# and only counted in the loss's normalisers, so the update is the whole mini-batch's. One sample of
# each mini-batch is always computed, so every parameter gets a (zero) gradient: AdamW moves on its
# moments even at a zero gradient, and skips a parameter that has none.

@dataclass
class SetAside:
    """What a mini-batch left out: counted in its loss's normalisers, computed nowhere."""

    rows: int = 0
    completion_tokens: int = 0  # tokens a loss term would have covered (an episode's model tokens)


def set_aside(samples: list[Sample], enabled: bool) -> tuple[list[Sample], SetAside]:
    """The samples to compute, and the counts of those left out; keeps one (the shortest) at least."""
    if not enabled:
        return samples, SetAside()
    keep = [s for s in samples if s.advantage != 0.0]
    if not keep:
        keep = [min(samples, key=lambda s: len(s.prompt_ids) + len(s.tokens))]
    kept = {id(s) for s in keep}
    left = [s for s in samples if id(s) not in kept]
    return keep, SetAside(len(left), sum(loss_tokens(s) for s in left))


def loss_tokens(sample: Sample) -> int:
    """The sample's tokens a loss term covers: its model's tokens (not an episode's observations)."""
    mask = sample.completion.model_mask()
    return len(sample.tokens) if mask is None else sum(mask)
