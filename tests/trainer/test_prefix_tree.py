"""train.prefix_tree: each distinct prefix of a micro-batch computed once (trainer/prefix_tree.py)."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from layout_helpers import (
    CPU,
    assert_layout_equals_padded,
    assert_rows_independent,
    assert_same_step,
    rewarded_groups,
    sample,
    train_one_step,
)

from aioareal.errors import UserError
from aioareal.group import Sample
from aioareal.models import random_model
from aioareal.trainer.batching import Layouts, PromptShare, collate, computed_positions
from aioareal.trainer.logprobs import token_logprobs
from aioareal.trainer.prefix_tree import PrefixTree, build_tree, plan_rows, use_tree, worthwhile_plan

ALWAYS, AUTO = Layouts(tree=True), Layouts(share=True, tree="auto")  # the tree always; where it pays, else shared


def groups_like_the_default_run(rng: random.Random, n_groups: int, g: int = 8) -> list[Sample]:
    """Short prompts, each with G completions drawn from a few answers: many identical or sharing a start."""
    out = []
    for _ in range(n_groups):
        prompt = [rng.randrange(3, 60) for _ in range(rng.randint(3, 7))]
        answers = [[rng.randrange(3, 60) for _ in range(rng.randint(1, 5))] for _ in range(3)]
        for _ in range(g):
            answer = list(rng.choice(answers))
            if rng.random() < 0.3:  # a variant that parts from the answer somewhere
                answer = answer[:rng.randint(0, len(answer))] + [rng.randrange(3, 60)]
            out.append(sample(prompt, answer))
    return out


def node_prefix(tree, row: int, node: int) -> list[int]:
    """The tokens from the root to `node`, read back through the mask (its ancestors, in order)."""
    ancestors = tree.mask[row, 0, node].nonzero().flatten().tolist()
    return [int(tree.input_ids[row, a]) for a in sorted(ancestors, key=lambda a: int(tree.position_ids[row, a]))]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10_000), n_groups=st.integers(1, 6), g=st.integers(1, 8),
       row_len=st.sampled_from([4, 16, 64]))
def test_property_every_prefix_is_one_node_and_every_target_points_at_its_prefix(seed, n_groups, g, row_len):
    samples = groups_like_the_default_run(random.Random(seed), n_groups, g)
    tree = build_tree(samples, pad_id=0, row_len=row_len)
    rows, width = tree.input_ids.shape
    counts = [len(row.tokens) for row in plan_rows(samples, row_len)[0]]
    assert len(counts) == rows and max(counts) == width
    for r, count in enumerate(counts):
        for pad in range(count, width):  # padding sees itself only and is seen by none
            assert tree.mask[r, 0, pad].nonzero().flatten().tolist() == [pad]
            assert tree.mask[r, 0, :, pad].nonzero().flatten().tolist() == [pad]
        prefixes = [tuple(node_prefix(tree, r, node)) for node in range(count)]
        for node, prefix in enumerate(prefixes):
            # Its ancestors sit at depths 0 .. its own, one each: a node attends to exactly its prefix.
            depths = sorted(int(tree.position_ids[r, a]) for a in tree.mask[r, 0, node].nonzero().flatten())
            assert depths == list(range(len(prefix))) and depths[-1] == int(tree.position_ids[r, node])
        assert len(prefixes) == len(set(prefixes))  # each distinct prefix once per row
        longest = max(len(s.prompt_ids) + len(s.tokens) - 1 for s in samples)
        assert count <= max(row_len, longest)
    # Each completion token, in loss_mask's order, is predicted by the node of its own prefix.
    mb = collate(samples, 0, CPU)
    expected = [(s.prompt_ids + s.tokens, t) for s in samples for t in range(len(s.prompt_ids) - 1,
                                                                              len(s.prompt_ids) + len(s.tokens) - 1)]
    assert tree.pair_index.shape[0] == int(mb.loss_mask.sum()) == len(expected)
    for (seq, t), pair in zip(expected, tree.pair_index.tolist()):
        flat = int(tree.pair_node[pair])
        assert node_prefix(tree, flat // width, flat % width) == seq[:t + 1]
        assert int(tree.pair_target[pair]) == seq[t + 1]
    pairs = list(zip(tree.pair_node.tolist(), tree.pair_target.tolist()))
    assert len(pairs) == len(set(pairs))  # identical (prefix, token) pairs share one log-prob
    assert tree.positions == worthwhile_plan(samples, 0, always=True, row_len=row_len)[1]  # what the packer counts


def test_identical_completions_are_computed_once():
    a = sample([4, 5, 6], [7, 8, 9])
    tree = build_tree([a, sample([4, 5, 6], [7, 8, 9]), sample([4, 5, 6], [7, 8, 10]), sample([4, 5, 11], [12])], 0)
    # Inputs: 4 5 6 7 8 (shared by the first three) and 11 (the fourth parts after 4 5): 6 nodes.
    assert tree.input_ids.tolist() == [[4, 5, 6, 7, 8, 11]] and tree.position_ids.tolist() == [[0, 1, 2, 3, 4, 2]]
    # Pairs: (6 -> 7), (7 -> 8), (8 -> 9), (8 -> 10), (11 -> 12): nine completion tokens, five log-probs.
    assert tree.pair_node.numel() == 5 and tree.pair_index.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 3, 4]


def test_tree_log_probs_entropies_and_gradients_equal_the_padded_ones():
    model = random_model("tiny", torch.float32, CPU, seed=3)
    samples = groups_like_the_default_run(random.Random(5), 5)
    mb = collate(samples, 0, CPU)
    tree = build_tree(samples, 0, row_len=16)  # several rows, and prompts split across them
    assert tree.input_ids.shape[0] > 1 and tree.positions < mb.input_ids.numel() / 2
    assert_layout_equals_padded(model, mb, tree)


def test_a_token_sees_only_its_own_prefix():
    """Changing one sequence's tokens changes the log-probs of that sequence alone, even where its
    nodes sit in a row between others."""
    model = random_model("tiny", torch.float32, CPU, seed=4)
    base = [sample([4, 5, 6], [7, 8]), sample([4, 5, 9], [10, 11]), sample([4, 5, 6], [7, 12])]
    changed = [base[0], sample([4, 5, 9], [13, 14]), base[2]]
    assert collate(base, 0, CPU, ALWAYS).layout.input_ids.shape[0] == 1  # all three in one row
    assert_rows_independent(model, base, changed, 1, ALWAYS)


def test_the_same_micro_batch_gives_bitwise_equal_gradients():
    """Sync runs replay exactly on resume: the gathers' backward must not add in a varying order."""
    model = random_model("tiny", torch.float32, CPU, seed=6)
    samples = groups_like_the_default_run(random.Random(7), 8)
    mb = collate(samples, 0, CPU, ALWAYS)
    grads = []
    for _ in range(2):
        logp, _ = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, layout=mb.layout)
        grads.append(torch.autograd.grad(logp.sum(), list(model.parameters())))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_auto_takes_the_tree_only_where_it_computes_few_enough_positions():
    rng = random.Random(8)
    alike = groups_like_the_default_run(rng, 8)
    assert isinstance(collate(alike, 0, CPU, AUTO).layout, PrefixTree)  # one layout at a time: not also shared
    # Long distinct completions: the tree cannot beat the shared prompts (rows hold one sequence).
    prompt = [rng.randrange(3, 60) for _ in range(40)]
    distinct = [sample(prompt, [rng.randrange(3, 60) for _ in range(50)]) for _ in range(8)]
    assert isinstance(collate(distinct, 0, CPU, AUTO).layout, PromptShare)
    assert isinstance(collate(distinct, 0, CPU, Layouts(share=True, tree=True)).layout, PrefixTree)  # true: always
    # computed_positions counts what collate computes.
    assert computed_positions(alike, 10_000, AUTO) == build_tree(alike, 0).positions
    assert computed_positions(distinct, 10_000, AUTO) == computed_positions(distinct, 10_000, Layouts(share=True))


def test_auto_builds_no_mask_for_a_tree_it_does_not_take(monkeypatch):
    """Planning the rows is cheap; the (T, T) mask of long sequences is not (it held the GIL for
    0.17 s a step in `bench e2e` before this was so)."""
    import aioareal.trainer.prefix_tree as prefix_tree

    def no_mask(*_):
        raise AssertionError("built a mask for a tree that was not taken")

    monkeypatch.setattr(prefix_tree, "_ancestor_mask", no_mask)
    rng = random.Random(10)
    prompt = [rng.randrange(3, 60) for _ in range(64)]
    distinct = [sample(prompt, [rng.randrange(3, 60) for _ in range(64)]) for _ in range(16)]
    assert not isinstance(collate(distinct, 0, CPU, AUTO).layout, PrefixTree)


@pytest.mark.parametrize("objective", ["ppo", "decoupled"])
def test_a_training_step_on_the_tree_equals_the_shared_prompt_one(objective):
    steps = {}
    for tree in (False, True):
        samples = groups_like_the_default_run(random.Random(9), 4, g=4)
        groups = rewarded_groups([samples[4 * g:4 * g + 4] for g in range(4)])
        steps[tree] = train_one_step([f"train.prefix_tree={str(tree).lower()}", f"algo.objective={objective}",
                                      "algo.kl_coef=0.05"], groups)
        assert all(isinstance(mb.layout, PrefixTree) == tree for mb in steps[tree][2])
    assert_same_step(steps[True], steps[False], ("loss", "grad_norm", "entropy", "kl"))


def test_settings_auto_on_the_cpu_and_true_needs_the_project_attention():
    model = random_model("tiny", torch.float32, CPU)
    assert use_tree("auto", CPU, model, compiled=False) == "auto"
    assert use_tree("auto", torch.device("cuda"), model, compiled=False) is False  # unmeasured there: opt in
    assert use_tree("auto", CPU, model, compiled=True) is False
    assert use_tree(False, CPU, model, compiled=False) is False
    with pytest.raises(UserError, match="train.prefix_tree=true does not combine with train.compile"):
        use_tree(True, CPU, model, compiled=True)
    model.config._attn_implementation = "sdpa"
    with pytest.raises(UserError, match="train.prefix_tree"):
        use_tree(True, CPU, model, compiled=False)


@pytest.mark.gpu
def test_tree_on_cuda_in_bf16_matches_the_padded_path():
    """On a GPU the tree's rows go through SDPA with the ancestor mask (no flash kernel)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cuda = torch.device("cuda")
    model = random_model("tiny", torch.float32, cuda, seed=3)
    samples = groups_like_the_default_run(random.Random(5), 8)
    mb = collate(samples, 0, cuda, ALWAYS)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        padded = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask)[0].float()
        ours = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, layout=mb.layout)[0].float()
    torch.testing.assert_close(ours, padded, atol=5e-2, rtol=2e-2)
