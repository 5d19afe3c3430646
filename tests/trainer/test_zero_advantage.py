"""train.skip_zero_advantage (trainer/batching.py): samples with a zero advantage are left out of
the forward and backward, and the gradient and the update are the whole mini-batch's."""
from __future__ import annotations

import copy

import pytest
import torch

from aioareal.config import load_config
from aioareal.group import Completion, Example, Group, Sample, Turn
from aioareal.models import random_model
from aioareal.trainer import Trainer, train_step
from aioareal.trainer.batching import collate
from aioareal.trainer.objective import StepSums, set_aside
from aioareal.trainer.trainer import assign_advantages


def _groups(rewards: list[list[float]], seed: int = 0) -> list[Group]:
    """One group per row of rewards; prompts differ by group, completions of 2..9 random tokens."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for gid, row in enumerate(rewards):
        prompt = [4, 5, 6 + gid]
        group = Group(gid, prompt, len(row), Example(str(gid), "q", "a"))
        for r in row:
            n = int(torch.randint(2, 10, (1,), generator=gen))
            tokens = torch.randint(10, 100, (n,), generator=gen).tolist()
            logprobs = (-torch.rand(n, generator=gen) * 3).tolist()
            group.samples.append(Sample(prompt, Completion(tokens, logprobs, [0] * n, "stop"), r))
        groups.append(group)
    return groups


def _trainer(skip: bool, overrides: list[str], model=None) -> Trainer:
    config = load_config(overrides=["algo.batch_groups=3", "algo.group_size=4",
                                    f"train.skip_zero_advantage={str(skip).lower()}", *overrides])
    model = model if model is not None else random_model("tiny", torch.float32, torch.device("cpu"), seed=1)
    return Trainer(model, config.algo, config.train, pad_id=0, loss_constant=16.0)


def _gradients(trainer: Trainer, groups: list[Group]) -> tuple[list[torch.Tensor], StepSums, int]:
    assign_advantages(groups, trainer.algo.adv_std_norm)
    (part,) = trainer.pack(groups)
    sums = StepSums()
    trainer.accumulate(part, float(trainer.version), sums)
    return [p.grad.clone() for p in trainer.params], sums, sum(mb.rows for mb in part)


@pytest.mark.parametrize("objective", ["ppo", "decoupled", "dg"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean", "constant"])
def test_the_gradient_is_the_whole_mini_batch_s(objective, agg):
    # Group 0's rewards are all equal (zero advantage), group 1's differ, group 2 has one sample at
    # its group's mean (a zero advantage inside a group that trains).
    rewards = [[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.5, 1.0, 0.5]]
    overrides = [f"algo.objective={objective}", f"algo.loss_agg={agg}", "algo.adv_std_norm=false"]
    whole = _trainer(False, overrides)
    skipping = _trainer(True, overrides, model=copy.deepcopy(whole.model))
    grads_whole, sums_whole, rows_whole = _gradients(whole, _groups(rewards))
    grads_skip, sums_skip, rows_skip = _gradients(skipping, _groups(rewards))
    assert rows_whole == 12 and rows_skip == 12 - 4 - 2  # group 0, and group 2's two samples at its mean
    assert any(g.abs().sum() > 0 for g in grads_whole)
    for a, b in zip(grads_whole, grads_skip):
        # Float sums in another order (other micro-batches): on an AVX2 CPU one element of 16,384 of dg's
        # token-mean gradient differed by 1.4e-8 (4e-5 of it, a sum that nearly cancels); no sample's
        # contribution is that small, so a missing or doubled sample still fails by far.
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(sums_skip.sums["loss"], sums_whole.sums["loss"], rtol=1e-5, atol=1e-8)


def test_a_mini_batch_of_equal_rewards_still_steps_the_optimizer_as_before():
    # Step 1 trains (AdamW's moments fill); in step 2 every reward is equal: one sample is computed,
    # its zero gradient reaches every parameter, and AdamW moves on its moments as with all twelve.
    whole = _trainer(False, [])
    skipping = _trainer(True, [], model=copy.deepcopy(whole.model))
    for trainer in (whole, skipping):
        train_step(trainer, _groups([[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]))
        before = [p.detach().clone() for p in trainer.params]
        metrics = train_step(trainer, _groups([[1.0] * 4, [0.0] * 4, [1.0] * 4], seed=1))
        assert metrics["grad_norm"] == 0.0
        assert any(not torch.equal(a, p) for a, p in zip(before, trainer.params))  # the moments moved them
        assert metrics["aside_samples"] == (11 if trainer is skipping else 0)
    for a, b in zip(whole.params, skipping.params):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_a_kl_penalty_computes_every_sample():
    trainer = _trainer(True, ["algo.kl_coef=0.1"])
    trainer.ref_model = random_model("tiny", torch.float32, torch.device("cpu"), seed=2).requires_grad_(False)
    assert not trainer.skip_zero_advantage
    metrics = train_step(trainer, _groups([[1.0] * 4, [0.0, 1.0, 0.0, 1.0], [0.0] * 4]))
    assert metrics["aside_samples"] == 0 and metrics["kl"] > 0


def test_set_aside_counts_an_episode_s_model_tokens_and_halves_keep_the_counts():
    samples = [Sample([1, 2], Completion([5, 6, 7], [-1.0] * 3, [0] * 3, "stop"), advantage=0.0),
               Sample([1, 2], Completion([8, 9], [-1.0] * 2, [0] * 2, "stop"), advantage=0.5),
               Sample([1, 2], Completion([3, 4, 5, 6], [-1.0] * 4, [0] * 4, "stop"), advantage=-0.5)]
    samples[0].completion.turns = [Turn("tool", "x", 1, 2)]  # an observation token in the middle
    keep, aside = set_aside(samples, enabled=True)
    assert keep == samples[1:] and (aside.rows, aside.completion_tokens) == (1, 2)
    assert set_aside(samples, enabled=False)[0] == samples
    # Nothing with an advantage: the shortest stays, so that the step has a gradient.
    for s in samples:
        s.advantage = 0.0
    keep, aside = set_aside(samples, enabled=True)
    assert keep == [samples[1]] and (aside.rows, aside.completion_tokens) == (2, 6)
    mb = collate(samples[1:], 0, torch.device("cpu"))
    mb.aside_rows, mb.aside_tokens = 1, 2
    halves = mb.halves()
    assert [(h.aside_rows, h.aside_tokens) for h in halves] == [(1, 2), (0, 0)]
