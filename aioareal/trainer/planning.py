"""Which samples share a micro-batch: the cuts of a batch under the token budget.

Padded rows are cut by length (`plan`): rows of similar length pad little. Where prompts are
shared (`PromptShare`, batching.py) a micro-batch computes each distinct prompt once, so `plan_shared`
keeps a group's rows together where that computes less.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..group import Sample
from .prefix_tree import Plan, TreeSetting, worthwhile_plan


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
    """Positions of the layout the trainer takes when not the prefix tree (batching.py `computed_positions`)."""
    if share:
        prompts = {tuple(s.prompt_ids) for s in samples}
        return len(prompts) * max(map(len, prompts)) + len(samples) * max(len(s.tokens) for s in samples)
    lengths = [len(s.prompt_ids) + len(s.tokens) for s in samples]
    return sum(lengths) if varlen else len(samples) * max(lengths)
