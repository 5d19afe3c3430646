"""Micro-batches for the shared-prompt layout (trainer/batching.py `plan_shared`): a group's rows
kept together, every sample once, each micro-batch within the budget, never dearer than `plan`."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal.group import Completion, Sample
from aioareal.trainer.batching import (
    MICRO_BATCH_POSITIONS,
    Layouts,
    _fullest_cuts,
    _plan_cost,
    computed_positions,
    layout_positions,
    pack,
    plan,
    plan_shared,
)


def _samples(spec: list[tuple[int, int, int]]) -> list[Sample]:
    """(prompt id, prompt length, completion length) per sample."""
    return [Sample([1000 + p] + [5] * (plen - 1), Completion([7] * c, [-0.1] * c, [0] * c, "stop"))
            for p, plen, c in spec]


def _cost(samples: list[Sample], batches: list[list[int]]) -> int:
    return sum(layout_positions([samples[i] for i in b], True, False) + MICRO_BATCH_POSITIONS for b in batches)


groups_strategy = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 60), st.integers(1, 80)), min_size=1,
                           max_size=60)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(spec=groups_strategy, budget=st.integers(1, 3000))
def test_property_plan_shared_covers_every_sample_once_within_budget(spec, budget):
    # Each prompt id keeps one length: a group's samples share their prompt.
    lengths = {p: plen for p, plen, _ in spec}
    samples = _samples([(p, lengths[p], c) for p, _, c in spec])
    batches = plan_shared(samples, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(samples)))
    for b in batches:
        assert len(b) == 1 or layout_positions([samples[i] for i in b], True, False) <= budget


@settings(max_examples=150, deadline=None, derandomize=True)
@given(spec=st.lists(st.tuples(st.integers(0, 7), st.integers(1, 80)), min_size=1, max_size=64),
       budget=st.integers(50, 3000))
def test_property_plan_shared_never_costs_more_than_cutting_by_length(spec, budget):
    # Prompts of one length: the order by length is `plan`'s, so its greedy cuts are one of the
    # plans the dynamic programme weighs.
    samples = _samples([(p, 30, c) for p, c in spec])
    chosen = plan_shared(samples, budget)
    if layout_positions(samples, True, False) <= budget:  # all fit: one micro-batch, no search
        assert len(chosen) == 1
        return
    by_length = plan([len(s.prompt_ids) + len(s.tokens) for s in samples], budget)
    assert _cost(samples, chosen) <= _cost(samples, by_length)


def test_a_group_computes_its_prompt_once_where_plan_would_scatter_it():
    # The sums config's shape: 8 groups of 8, 50-token prompts, completions 20-64 tokens.
    rng = random.Random(0)
    samples = _samples([(g, 50, rng.randint(20, 64)) for g in range(8) for _ in range(8)])
    batches = plan_shared(samples, 1024)
    prompts_computed = sum(len({samples[i].prompt_ids[0] for i in b}) for b in batches)
    by_length = plan([len(s.prompt_ids) + len(s.tokens) for s in samples], 1024)
    assert prompts_computed < sum(len({samples[i].prompt_ids[0] for i in b}) for b in by_length)
    assert computed_positions(samples, 1024, Layouts(share=True)) < sum(
        layout_positions([samples[i] for i in b], True, False) for b in by_length)
    # The trainer's micro-batches are the plan's.
    packed = pack(samples, 1024, 0, "cpu", Layouts(share=True))
    assert [mb.layout.prompt_ids.shape[0] for mb in packed] == [len({samples[i].prompt_ids[0] for i in b})
                                                              for b in batches]


def test_one_group_with_room_to_spare_is_one_micro_batch():
    samples = _samples([(0, 40, c) for c in (3, 9, 4, 12, 7, 5, 8, 6)])
    assert plan_shared(samples, 1024) == [[0, 2, 5, 7, 4, 6, 1, 3]]  # by completion length
    # Padded, the same budget holds them too, but computes the prompt 8 times.
    assert computed_positions(samples, 1024, Layouts(share=True)) == 40 + 8 * 12


@settings(max_examples=60, deadline=None, derandomize=True)
@given(spec=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=40),
       budget=st.integers(20, 2000))
def test_property_with_the_tree_no_plan_computes_more_than_filling_each_micro_batch(spec, budget):
    # Groups whose completions repeat (answer ids 0-2): the prefix tree shares them, and shares
    # more the more rows a micro-batch holds, so cutting small may cost more than it saves.
    samples = [Sample([1000 + p, 5, 6, 7], Completion([7, a, 8 + a], [-0.1] * 3, [0] * 3, "stop"))
               for p, a in spec]
    chosen = _plan_cost(samples, plan_shared(samples, budget, tree="auto"), "auto")
    assert chosen <= _plan_cost(samples, _fullest_cuts(samples, list(range(len(samples))), budget), "auto")
