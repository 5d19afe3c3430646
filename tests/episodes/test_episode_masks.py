"""Episodes in the trainer (docs/architecture.md rule 9): observation tokens are context, never actions. Every
layout (padded, shared prompts, varlen, prefix tree) leaves them out of the loss, the advantage, the
KL, the entropy and the log-prob gap, and the loss on hand-built multi-turn samples equals a plain
reference written from the formula."""
from __future__ import annotations

import math
import random

import pytest
import torch
from episode_helpers import episode, model_positions, random_episode
from hypothesis import given, settings
from hypothesis import strategies as st
from layout_helpers import CPU, assert_layout_equals_padded

from aioareal.config import load_config
from aioareal.group import MODEL, OBS_VERSION, Completion, Example, Group, Sample
from aioareal.models import random_model
from aioareal.trainer import Trainer
from aioareal.trainer.batching import Layouts, PromptShare, VarlenRows, build_share, build_varlen, collate
from aioareal.trainer.objective import StepSums
from aioareal.trainer.prefix_tree import PrefixTree, build_tree

PROMPT = [4, 5, 6, 7]
LAYOUTS = {"padded": Layouts(), "shared": Layouts(share=True), "varlen": Layouts(varlen=True),
           "tree": Layouts(tree=True)}
TAKEN = {"shared": PromptShare, "varlen": VarlenRows, "tree": PrefixTree}


def hand_built() -> list[Sample]:
    """Two turns with a tool's answer between them, three turns, one turn (a single completion's
    record), and two episodes that share their first turn (the prefix tree merges it)."""
    return [episode(PROMPT, [(MODEL, [20, 21, 22]), ("tool", [30, 31]), (MODEL, [23, 24])]),
            episode(PROMPT, [(MODEL, [25]), ("tool", [32]), (MODEL, [26, 27]), ("user", [33, 34, 35]), (MODEL, [28])]),
            Sample(PROMPT, Completion([40, 41, 42], [-1.0] * 3, [0] * 3, "stop")),
            episode(PROMPT, [(MODEL, [20, 21, 22]), ("tool", [36]), (MODEL, [29])]),
            episode(PROMPT, [(MODEL, [20, 21, 22]), ("tool", [37, 38]), (MODEL, [29, 30])])]


def test_the_record_marks_observations_and_keeps_their_placeholders_out_of_versions():
    s = hand_built()[0]
    assert s.completion.model_mask() == [True, True, True, False, False, True, True]
    assert s.completion.versions[3:5] == [OBS_VERSION] * 2 and all(math.isnan(x) for x in s.completion.logprobs[3:5])
    assert (s.version_min, s.version_max, s.completion.obs_tokens) == (0, 0, 2)
    s.completion.versions[5:] = [3, 4]
    assert (s.version_min, s.version_max, s.staleness(6)) == (0, 4, 6)
    assert hand_built()[2].completion.model_mask() is None  # a single completion: every token the model's


def test_collate_masks_observation_targets_and_zeroes_their_placeholders():
    samples = hand_built()
    mb = collate(samples, 0, CPU)
    for row, s in enumerate(samples):
        first = len(s.prompt_ids) - 1
        expected = [first + j for j in model_positions(s)]
        assert mb.loss_mask[row].nonzero().flatten().tolist() == expected
    assert torch.isfinite(mb.behav_logp).all()  # the NaN placeholders never reach a tensor
    assert (mb.behav_logp[~mb.loss_mask] == 0).all()
    assert mb.completion_tokens == sum(len(model_positions(s)) for s in samples) == int(mb.loss_mask.sum())
    assert mb.real_tokens == sum(len(s.prompt_ids) + len(s.tokens) for s in samples)  # observations are computed


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), turns=st.integers(1, 4))
def test_property_every_layout_predicts_exactly_the_model_tokens_in_loss_mask_order(seed, n, turns):
    rng = random.Random(seed)
    samples = [random_episode(rng, PROMPT if i % 2 else [9, 8], turns) for i in range(n)]
    mb = collate(samples, 0, CPU)
    targets = mb.input_ids[:, 1:][mb.loss_mask].tolist()
    assert targets == [s.tokens[j] for s in samples for j in model_positions(s)]
    share = build_share(samples, 0)
    assert share.targets[share.target_mask].tolist() == targets
    assert share.input_mask.sum() == sum(len(s.tokens) - 1 for s in samples)  # observations stay inputs
    rows = build_varlen(samples)
    assert [rows.input_ids[0, i + 1].item() for i in rows.target_index.tolist()] == targets
    tree = build_tree(samples, 0)
    assert tree.pair_target[tree.pair_index].tolist() == targets


@pytest.mark.parametrize("layout", ["shared", "varlen", "tree"])
def test_each_layout_equals_the_padded_path_on_multi_turn_samples(layout):
    model = random_model("tiny", torch.float32, CPU, seed=2)
    mb = collate(hand_built(), 0, CPU, LAYOUTS[layout])
    assert isinstance(mb.layout, TAKEN[layout])
    assert_layout_equals_padded(model, mb, mb.layout)


def groups_for(model: torch.nn.Module) -> list[Group]:
    """The hand-built episodes as two groups, behaviour log-probs the model's own shifted by a known
    amount per token (ratios away from 1, some past the clip), advantages set by hand."""
    samples = hand_built()
    rng = random.Random(0)
    with torch.no_grad():
        for s in samples:
            exact = reference_logprobs(model, s)
            for j, lp in zip(model_positions(s), exact.tolist()):
                s.completion.logprobs[j] = lp + rng.choice([-0.5, -0.1, 0.0, 0.1, 0.5])
    for s, adv in zip(samples, [1.0, -0.5, 0.25, -1.0, 0.75]):
        s.advantage = adv
    return [Group(0, PROMPT, 3, Example("0", "q", "a"), samples=samples[:3]),
            Group(1, PROMPT, 2, Example("1", "q", "a"), samples=samples[3:])]


def reference_logprobs(model: torch.nn.Module, s: Sample) -> torch.Tensor:
    """log pi of the model's tokens from one plain forward of prompt + every token."""
    ids = torch.tensor([s.prompt_ids + s.tokens])
    logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    at = [len(s.prompt_ids) + j for j in model_positions(s)]
    return logp[[t - 1 for t in at], ids[0, at]]


def reference_loss(model: torch.nn.Module, groups: list[Group], eps: float, kl_coef: float,
                   ref: torch.nn.Module) -> torch.Tensor:
    """PPO's clipped surrogate plus k3 KL, token-mean over the model's tokens only, written out."""
    terms, count = [], 0
    for s in (s for g in groups for s in g.samples):
        logp = reference_logprobs(model, s)
        behav = torch.tensor([s.completion.logprobs[j] for j in model_positions(s)])
        ratio = torch.exp(logp - behav)
        surrogate = torch.minimum(ratio * s.advantage, ratio.clamp(1 - eps, 1 + eps) * s.advantage)
        with torch.no_grad():
            ref_logp = reference_logprobs(ref, s)
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
        terms.append((-surrogate + kl_coef * kl).sum())
        count += len(logp)
    return torch.stack(terms).sum() / count


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_loss_and_its_gradient_equal_the_reference_in_every_layout(layout):
    config = load_config(overrides=["algo.objective=ppo", "algo.kl_coef=0.1", "algo.loss_agg=token-mean"])
    model = random_model("tiny", torch.float32, CPU, seed=1)
    ref = random_model("tiny", torch.float32, CPU, seed=5).requires_grad_(False)
    groups = groups_for(model)
    expected = reference_loss(model, groups, config.algo.clip_eps_low, config.algo.kl_coef, ref)
    want = torch.autograd.grad(expected, list(model.parameters()))
    trainer = Trainer(model, config.algo, config.train, pad_id=0, ref_model=ref)
    trainer.layouts = LAYOUTS[layout]
    (part,) = trainer.pack(groups)
    trainer.fill_fixed_logprobs([part])
    sums = StepSums()
    trainer.accumulate(part, trainer.version, sums)
    assert sums.sums["loss"].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    assert sums.sums["tokens"].item() == sum(len(model_positions(s)) for g in groups for s in g.samples)
    for p, g in zip(model.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, g, atol=1e-6, rtol=1e-4)
    assert math.isfinite(sums.sums["entropy"].item()) and math.isfinite(sums.sums["logprob_gap"].item())


def test_observation_placeholders_change_nothing_the_trainer_computes():
    """Whatever an observation position holds in logprobs and versions, the step's figures are the same."""
    config = load_config(overrides=["algo.objective=decoupled", "algo.prox=loglinear"])
    results = []
    for placeholder in (math.nan, 123.0):
        model = random_model("tiny", torch.float32, CPU, seed=1)
        groups = groups_for(model)
        for s in (s for g in groups for s in g.samples):
            mask = s.completion.model_mask() or []
            for j, m in enumerate(mask):
                if not m:
                    s.completion.logprobs[j], s.completion.versions[j] = placeholder, 7
        trainer = Trainer(model, config.algo, config.train, pad_id=0)
        (part,) = trainer.pack(groups)
        sums = StepSums()
        trainer.accumulate(part, 0.5, sums)
        results.append({k: v.item() for k, v in sums.sums.items()})
    assert results[0] == pytest.approx(results[1], rel=1e-6)
