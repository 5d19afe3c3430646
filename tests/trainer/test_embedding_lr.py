"""algo.embedding_lr_scale (trainer/optim.py): the token embedding and the head tied to it learn at
algo.lr x the scale, in a parameter group of their own; 0 freezes them, so a step leaves them
exactly as they were and computes no gradient for them, while every other weight trains; a model
with an untied head gets both in the slow group."""
from __future__ import annotations

import copy

import pytest
import torch
from test_zero_advantage import _groups

from aioareal.config import load_config
from aioareal.errors import UserError
from aioareal.models import random_model
from aioareal.trainer import Trainer, train_step
from aioareal.trainer.optim import embedding_weights

REWARDS = [[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]


def trainer(scale: float, model=None, moments: str = "float32") -> Trainer:
    config = load_config(overrides=["algo.batch_groups=3", "algo.group_size=4", "algo.lr=1e-3",
                                    f"algo.embedding_lr_scale={scale}", f"train.optimizer_moments={moments}"])
    model = model if model is not None else random_model("tiny", torch.float32, torch.device("cpu"), seed=1)
    return Trainer(model, config.algo, config.train, pad_id=0, loss_constant=16.0)


def changed(before: torch.nn.Module, after: torch.nn.Module) -> dict[str, bool]:
    old = dict(before.named_parameters())
    return {name: not torch.equal(p, old[name]) for name, p in after.named_parameters()}


@pytest.mark.parametrize("moments", ["float32", "bfloat16"])
def test_zero_freezes_the_embedding_and_the_rest_trains(moments):
    t = trainer(0.0, moments=moments)
    start = copy.deepcopy(t.model)
    [embedding] = embedding_weights(t.model)  # the tiny model's head is tied to its embedding
    assert not embedding.requires_grad and not any(p is embedding for p in t.params)
    train_step(t, _groups(REWARDS))
    moved = changed(start, t.model)
    assert not moved["model.embed_tokens.weight"]
    assert sum(moved.values()) == len(moved) - 1, [n for n, m in moved.items() if not m]


def test_a_scale_puts_the_embedding_in_a_group_of_its_own():
    t = trainer(0.25)
    [rest, slow] = t.optimizer.param_groups
    assert slow["lr"] == pytest.approx(0.25e-3) and rest["lr"] == pytest.approx(1e-3)
    assert len(slow["params"]) == 1 and slow["params"][0] is embedding_weights(t.model)[0]
    assert len(trainer(1.0).optimizer.param_groups) == 1


def test_an_untied_head_is_slowed_with_the_embedding():
    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=1)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    weights = embedding_weights(model)
    assert len(weights) == 2 and weights[1] is model.lm_head.weight
    t = trainer(0.0, model=model)
    start = copy.deepcopy(t.model)
    train_step(t, _groups(REWARDS))
    moved = changed(start, t.model)
    assert not moved["model.embed_tokens.weight"] and not moved["lm_head.weight"]
    assert moved["model.layers.0.self_attn.q_proj.weight"]


def test_a_negative_scale_is_refused_naming_the_key():
    with pytest.raises(UserError, match="algo.embedding_lr_scale"):
        load_config(overrides=["algo.embedding_lr_scale=-1"])


def test_a_learning_rate_large_for_the_weights_scale_is_warned_with_one_that_fits():
    from aioareal.trainer.optim import MAX_RELATIVE_STEP, relative_step_warning, typical_weight

    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=1)
    typical = typical_weight(model)
    assert 0 < typical < 0.1
    note = relative_step_warning(model, 4 * MAX_RELATIVE_STEP * typical)
    assert note is not None and note.startswith("warning: algo.lr=") and "try algo.lr=" in note
    suggested = float(note.rsplit("algo.lr=", 1)[1])
    assert relative_step_warning(model, suggested) is None
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10)  # weights ten times larger: the same lr is a ten times smaller step for them
    assert relative_step_warning(model, 4 * MAX_RELATIVE_STEP * typical) is None


def test_lora_runs_are_warned_only_past_a_bound_ten_times_wider():
    from aioareal.trainer.optim import LORA_STEP_FACTOR, MAX_RELATIVE_STEP, relative_step_warning, typical_weight

    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=1)
    typical = typical_weight(model)
    between = 4 * MAX_RELATIVE_STEP * typical  # past full fine-tuning's bound, within LoRA's
    assert relative_step_warning(model, between) is not None
    assert relative_step_warning(model, between, lora=True) is None
    note = relative_step_warning(model, 2 * LORA_STEP_FACTOR * MAX_RELATIVE_STEP * typical, lora=True)
    assert note is not None and "the adapters" in note
    assert relative_step_warning(model, float(note.rsplit("algo.lr=", 1)[1]), lora=True) is None
