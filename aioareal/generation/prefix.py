"""Shared-prefix decode attention: a group's prompt K/V read once per group, not once per sample.

Prefill copies a group's prompt K/V into each of its G slots, so a plain decode step, bound by
memory traffic, reads the same prompt G times. Here attention is two softmax parts merged by their
log-sum-exp:
- prefix: the group's prompt keys, read from one slot of the group (its `leader`), the group's
  queries batched against them (GQA: the query heads of one KV head side by side);
- suffix: each slot's own keys from the shortest prompt on, masked to [its prompt length, its position].
The leader is picked among the slots decoded in this very step, so it is never a freed and refilled
slot. The cache layout, prefill and the recompute are unchanged.

Eager only: the layout changes with each admission and finish, which a fixed-shape CUDA graph cannot
follow. Off by default; not measured on a GPU yet (`bench gen --shared-prefix`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .scheduler import Running, upload


@dataclass
class PrefixLayout:
    """Where each decoded row's group sits. Rows are the running slots in ascending order."""

    rows: torch.Tensor  # (n,) slots decoded
    group: torch.Tensor  # (n,) each row's group index in [0, groups)
    member: torch.Tensor  # (n,) each row's place within its group in [0, width)
    leaders: torch.Tensor  # (groups,) one decoded slot per group: where its prompt K/V is read
    group_prompt: torch.Tensor  # (groups,) prompt length per group
    row_prompt: torch.Tensor  # (n,) prompt length per row
    groups: int
    width: int  # the most rows of one group
    longest: int  # the longest prompt
    shortest: int  # the shortest prompt
    key: tuple  # what the layout was built from: rebuilt only when it changes


def layout_of(running: dict[int, Running], device: torch.device,
              previous: PrefixLayout | None = None) -> PrefixLayout:
    """The layout of the running sequences; `previous` itself while what it was built from holds."""
    slots = sorted(running)
    # Grouped by what prefilled the slot: turns of one group continuing different histories share
    # nothing. A recycled id() still yields the same layout.
    key = tuple((s, id(running[s].unit), running[s].prompt_len) for s in slots)
    if previous is not None and previous.key == key:
        return previous
    index: dict[int, int] = {}
    leaders, group_prompt, group, member, sizes = [], [], [], [], []
    for slot in slots:
        r = running[slot]
        g = index.setdefault(id(r.unit), len(index))
        if g == len(leaders):
            leaders.append(slot)
            group_prompt.append(r.prompt_len)
            sizes.append(0)
        group.append(g)
        member.append(sizes[g])
        sizes[g] += 1
    prompts = [running[s].prompt_len for s in slots]
    meta = upload([slots, group, member, prompts], device)  # one pinned, non-blocking copy
    groups = upload([leaders, group_prompt], device)
    return PrefixLayout(meta[0], meta[1], meta[2], groups[0], groups[1], meta[3], len(leaders), max(sizes),
                        max(prompts), min(prompts), key)


def _softmax_parts(scores: torch.Tensor, valid: torch.Tensor, values: torch.Tensor):
    """Masked scores (..., S) fp32 -> (max, sum of exponentials, normalised output (..., D)). A fully
    masked row gets the dtype's minimum, not -inf: no NaN, and the merge discards it."""
    scores = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul((weights / total).to(values.dtype), values)
    return top, total, out


def shared_prefix_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                            span: int, layout: PrefixLayout) -> torch.Tensor:
    """q (n, H, D) at positions pos (n,); k/v_cache (slots, max_len, Hkv, D) with the rows' own keys
    written -> (n, H*D), equal to attending over each row's keys [0, pos]."""
    n, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    rep = heads // kv_heads
    scale = dim ** -0.5
    # Prefix: (groups, Hkv, width*rep, D) queries against each group's prompt, read once.
    qg = q.new_zeros(layout.groups, layout.width, heads, dim)
    qg[layout.group, layout.member] = q
    qg = qg.view(layout.groups, layout.width, kv_heads, rep, dim).permute(0, 2, 1, 3, 4)
    qg = qg.reshape(layout.groups, kv_heads, layout.width * rep, dim)
    kp = k_cache[layout.leaders, :layout.longest].transpose(1, 2)  # (groups, Hkv, P, D)
    vp = v_cache[layout.leaders, :layout.longest].transpose(1, 2)
    keys = torch.arange(layout.longest, device=q.device)
    valid = (keys[None, :] < layout.group_prompt[:, None])[:, None, None, :]
    top_p, sum_p, out_p = _softmax_parts(torch.matmul(qg, kp.transpose(-1, -2)).float() * scale, valid, vp)

    def per_row(t: torch.Tensor) -> torch.Tensor:  # (groups, Hkv, width*rep, X) -> (n, H, X)
        t = t.view(layout.groups, kv_heads, layout.width, rep, -1).permute(0, 2, 1, 3, 4)
        return t[layout.group, layout.member].reshape(n, heads, -1)

    top_p, sum_p, out_p = per_row(top_p), per_row(sum_p), per_row(out_p)
    # Suffix: each row's own keys from the shortest prompt on.
    ks = k_cache[layout.rows, layout.shortest:span].permute(0, 2, 3, 1)  # (n, Hkv, D, S)
    vs = v_cache[layout.rows, layout.shortest:span].transpose(1, 2)  # (n, Hkv, S, D)
    keys = torch.arange(layout.shortest, span, device=q.device)
    valid = ((keys[None, :] >= layout.row_prompt[:, None]) & (keys[None, :] <= pos[:, None]))[:, None, None, :]
    qs = q.view(n, kv_heads, rep, dim)
    top_s, sum_s, out_s = _softmax_parts(torch.matmul(qs, ks).float() * scale, valid, vs)
    top_s, sum_s, out_s = (t.reshape(n, heads, -1) for t in (top_s, sum_s, out_s))
    # Merge the two normalised parts by their share of the total exponential mass.
    top = torch.maximum(top_p, top_s)
    w_p, w_s = sum_p * torch.exp(top_p - top), sum_s * torch.exp(top_s - top)
    out = (out_p.float() * w_p + out_s.float() * w_s) / (w_p + w_s)
    return out.to(q.dtype).reshape(n, heads * dim)
