"""Engine and trainer agree, measured every step: logprob_gap_mean / logprob_gap_max over the tokens
sampled by the version the trainer holds, on hand-built groups with chosen behaviour log-probs and
on groups the engine sampled from the trainer's own fp32 weights."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from hand_groups import CPU, groups_with_behaviour, known_shift, trainer_for

from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.group import Completion, Example, Group, Sample
from aioareal.trainer import train_step
from aioareal.trainer.batching import collate
from aioareal.trainer.objective import StepSums, gap_stats, read_back, step_figures


def test_gap_stats_by_hand():
    mb = collate([Sample([5], Completion([8, 9, 10], [-1.0, -2.0, -3.0], [3, 3, 2])),
                  Sample([5], Completion([11], [-0.5], [3]))], pad_id=0, device=CPU)
    trainer_logp = torch.tensor([[-1.25, -1.0, -9.0], [-0.5, 7.0, 7.0]])  # off-mask and stale entries must not count
    stats = gap_stats(mb, trainer_logp, version=3)
    # Version-3 tokens: row 0 columns 0 and 1 (|0.25|, |1.0|), row 1 column 0 (0); the version-2 token is stale.
    assert stats["logprob_gap_tokens"] == 3
    torch.testing.assert_close(stats["logprob_gap"], torch.tensor(1.25))
    torch.testing.assert_close(stats["logprob_gap_max"], torch.tensor(1.0))


@pytest.mark.parametrize("objective", ["ppo", "decoupled", "dg"])
def test_gap_is_zero_when_behaviour_logprobs_are_the_trainers_own(objective):
    trainer = trainer_for(objective, "algo.kl_coef=0")
    metrics = train_step(trainer, groups_with_behaviour(trainer.model, lambda *_: 0.0))
    assert metrics["logprob_gap_mean"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["logprob_gap_max"] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("objective, minibatches", [("ppo", 1), ("dg", 1), ("decoupled", 2)])
def test_gap_equals_the_known_perturbation_and_leaves_stale_tokens_out(objective, minibatches):
    """Group 1's first two samples come from version 0 while the trainer holds version 1: their
    (large) shift is staleness, not the engine/trainer mismatch, and must not count."""
    trainer = trainer_for(objective, f"algo.minibatches={minibatches}", "algo.ppo_epochs=2", version=1)
    stale = lambda gid, i: gid == 1 and i < 2  # noqa: E731
    shift = lambda gid, i, j: 3.0 if stale(gid, i) else known_shift(gid, i, j)  # noqa: E731
    groups = groups_with_behaviour(trainer.model, shift, versions_of=lambda gid, i: 0 if stale(gid, i) else 1)
    fresh = [abs(known_shift(gid, i, j)) for gid, group in enumerate(groups) for i, s in enumerate(group.samples)
             if not stale(gid, i) for j in range(len(s.tokens))]
    metrics = train_step(trainer, groups)
    assert metrics["logprob_gap_mean"] == pytest.approx(sum(fresh) / len(fresh), abs=1e-5)
    assert metrics["logprob_gap_max"] == pytest.approx(max(fresh), abs=1e-5)
    assert 0 < metrics["stale_token_frac"] < 1


def test_ppo_with_several_minibatches_measures_the_first_one_before_any_update():
    """ppo makes no pass before the update: its first mini-batch's forward gives the trainer's
    log-probs for those tokens, the later mini-batches are trained after an update and not measured."""
    trainer = trainer_for("ppo", "algo.minibatches=2")
    groups = groups_with_behaviour(trainer.model, known_shift)
    first = [abs(known_shift(0, i, j)) for i, s in enumerate(groups[0].samples) for j in range(len(s.tokens))]
    metrics = train_step(trainer, groups)
    assert metrics["logprob_gap_mean"] == pytest.approx(sum(first) / len(first), abs=1e-5)
    assert metrics["logprob_gap_max"] == pytest.approx(max(first), abs=1e-5)


def test_every_token_stale_gives_nan():
    trainer = trainer_for("ppo", version=3)
    metrics = train_step(trainer, groups_with_behaviour(trainer.model, known_shift))  # all of version 0
    assert math.isnan(metrics["logprob_gap_mean"]) and math.isnan(metrics["logprob_gap_max"])
    assert metrics["stale_token_frac"] == 1.0


def test_gap_is_zero_for_groups_the_engine_sampled_with_the_same_fp32_weights():
    trainer = trainer_for("ppo")
    params = SamplingParams(temperature=0.8, max_new_tokens=8)
    trainer.temperature = params.temperature
    engine = Engine(copy.deepcopy(trainer.model), [1], EngineOptions(num_slots=8, max_len=40, params=params, seed=1))
    for gid in range(2):
        engine.submit(Group(gid, [4 + gid, 5, 6, 7], 4, Example(str(gid), "q", "a")))
    groups = []
    while engine.busy:
        groups += engine.step()
    for group in groups:
        group.set_rewards([float(i % 2) for i in range(group.size)])
    metrics = train_step(trainer, sorted(groups, key=lambda g: g.group_id))
    assert metrics["logprob_gap_mean"] == pytest.approx(0.0, abs=1e-4)
    assert metrics["logprob_gap_max"] == pytest.approx(0.0, abs=1e-4)


class TwoEqualRanks:
    """A collective as two ranks that hold the same figures would reduce them."""

    size = 2

    def sum_(self, values: torch.Tensor) -> torch.Tensor:
        return values * 2

    def max_(self, values: torch.Tensor) -> torch.Tensor:
        return values


def test_maxima_are_reduced_by_max_over_ranks_and_sums_by_sum():
    step = StepSums(updates=1, norms=[torch.tensor(1.0)])
    step.add({"loss": torch.tensor(0.5), "tokens": torch.tensor(4.0), "entropy": torch.tensor(2.0),
              "clipped": torch.tensor(0.0), "behav_weight": torch.tensor(4.0), "behav_weight_max": torch.tensor(3.0),
              "behav_outside_clip": torch.tensor(1.0), "stale_tokens": torch.tensor(0.0),
              "logprob_gap": torch.tensor(0.8), "logprob_gap_tokens": torch.tensor(4.0),
              "logprob_gap_max": torch.tensor(0.5)})
    step.add({"logprob_gap_max": torch.tensor(0.25), "logprob_gap": torch.tensor(0.0)})  # max, and sums, combine
    figures = step_figures(read_back(step, TwoEqualRanks()), step.updates)
    assert figures["behav_weight_max"] == 3.0 and figures["logprob_gap_max"] == 0.5  # not doubled
    assert figures["logprob_gap_mean"] == pytest.approx(0.2) and figures["behav_weight_mean"] == 1.0
