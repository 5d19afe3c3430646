"""What the trainer-layout tests share (test_trainer.py, test_prefix_tree.py, test_varlen.py): each
layout that computes a micro-batch differently (shared prompts, one row per micro-batch, the prefix
tree) must give the padded path's log-probs, entropies and gradients, and a whole training step
that equals the other layout's."""
from __future__ import annotations

import math
import random

import pytest
import torch

from aioareal.config import load_config
from aioareal.group import Completion, Example, Group, Sample
from aioareal.run.build import build_models, build_trainer
from aioareal.trainer import train_step
from aioareal.trainer.batching import Layout, Layouts, MicroBatch, collate
from aioareal.trainer.logprobs import token_logprobs

CPU = torch.device("cpu")


def sample(prompt: list[int], tokens: list[int]) -> Sample:
    return Sample(prompt, Completion(tokens, [-1.0] * len(tokens), [0] * len(tokens), "stop"), 1.0)


def rewarded_groups(batches: list[list[Sample]]) -> list[Group]:
    """One group per batch of samples that continue one prompt, rewards 0 and 1 in turns."""
    groups = []
    for g, batch in enumerate(batches):
        for i, s in enumerate(batch):
            s.reward = float(i % 2)
        groups.append(Group(g, batch[0].prompt_ids, len(batch), Example(str(g), "q", "a"), samples=batch))
    return groups


def layout_logprobs(model: torch.nn.Module, mb: MicroBatch, temperature: float = 1.0, chunk: int = 2048,
                    layout: Layout = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of `mb`'s rows, padded (None) or in `layout`."""
    return token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature, chunk, layout)


def assert_layout_equals_padded(model: torch.nn.Module, mb: MicroBatch, layout: Layout, temperature: float = 0.7,
                                chunk: int = 5) -> None:
    """`mb`'s rows in `layout` (a PromptShare, VarlenRows or PrefixTree) against the same rows padded:
    log-probs, entropies, zeros off the loss mask, and the gradients of a randomly weighted sum of the log-probs."""
    assert layout is not None  # a layout to compare, or the test compares padded with padded
    weights = torch.randn(mb.loss_mask.shape, generator=torch.Generator().manual_seed(0))
    results = []
    for taken in (None, layout):
        logp, entropy = layout_logprobs(model, mb, temperature, chunk, taken)
        grads = torch.autograd.grad((logp * weights).sum(), list(model.parameters()))
        results.append((logp, entropy, grads))
    (ref, ref_entropy, ref_grads), (ours, entropy, grads) = results
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    assert (ours[~mb.loss_mask] == 0).all()
    for x, y in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def assert_rows_independent(model: torch.nn.Module, batch: list[Sample], changed: list[Sample], row: int,
                            layouts: Layouts) -> None:
    """Changing sample `row` (same lengths, other tokens) changes that sample's log-probs alone, in
    the layout collate builds with `layouts`: no token attends outside its own sequence."""
    with torch.no_grad():
        mbs = [collate(b, 0, CPU, layouts) for b in (batch, changed)]
        logps = [layout_logprobs(model, mb, layout=mb.layout)[0] for mb in mbs]
    others = [i for i in range(len(batch)) if i != row]
    torch.testing.assert_close(logps[0][others], logps[1][others], rtol=0, atol=1e-6)
    assert not torch.allclose(logps[0][row], logps[1][row])


def train_one_step(overrides: list[str], groups: list[Group]) -> tuple[dict[str, float], list[torch.Tensor], list]:
    """One training step of the random tiny model, built as a run builds it, on `groups`: its
    metrics, the weights after it, and the micro-batches the trainer packed."""
    config = load_config(overrides=["model.name=random:tiny", "algo.group_size=4", *overrides])
    torch.manual_seed(0)
    trainer = build_trainer(config, build_models(config, config.model.name, None, CPU, CPU), pad_id=0)
    trainer.max_logprob_gap = math.inf  # hand-made behaviour log-probs come from no generator
    packed = [mb for part in trainer.pack(groups) for mb in part]
    metrics = train_step(trainer, groups)
    return metrics, [p.detach().clone() for p in trainer.params], packed


def assert_same_step(a: tuple[dict[str, float], list[torch.Tensor], list],
                     b: tuple[dict[str, float], list[torch.Tensor], list], keys: tuple[str, ...]) -> None:
    """Two `train_one_step` results: the same metrics (`keys`) and the same weights after the step."""
    for key in keys:
        assert a[0][key] == pytest.approx(b[0][key], rel=1e-4, abs=1e-6), key
    for x, y in zip(a[1], b[1], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


def random_batches(rng: random.Random, groups: int, size: int) -> list[list[Sample]]:
    """`groups` batches of `size` samples, each batch continuing one random prompt of 2 to 8 tokens
    with 1 to 8 random tokens."""
    batches = []
    for _ in range(groups):
        prompt = [rng.randrange(3, 100) for _ in range(rng.randint(2, 8))]
        batches.append([sample(prompt, [rng.randrange(3, 100) for _ in range(rng.randint(1, 8))]) for _ in range(size)])
    return batches
