"""train.precision=masters (trainer/masters.py): a bf16 working copy runs forward and backward, the
optimizer updates fp32 masters kept apart and copies them back."""
from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal.config import load_config
from aioareal.errors import UserError
from aioareal.group import Completion, Example, Group, Sample
from aioareal.models import random_model
from aioareal.trainer import Trainer, train_step
from aioareal.trainer.batching import pack
from aioareal.trainer.logprobs import token_logprobs
from aioareal.trainer.masters import WorkingCopy, working_copy

# The bf16 bound tests/models/test_smollm2.py puts on a bf16 generator's log-probs against fp32 ones (nats).
BF16_MEAN, BF16_MAX = 0.1, 0.6
CPU = torch.device("cpu")


def _groups(seed: int, n_groups: int = 3, g: int = 4) -> list[Group]:
    rng = random.Random(seed)
    groups = []
    for gid in range(n_groups):
        prompt = [rng.randrange(3, 100) for _ in range(rng.randint(3, 8))]
        group = Group(gid, prompt, g, Example(str(gid), "q", "a"))
        for i in range(g):
            tokens = [rng.randrange(3, 100) for _ in range(rng.randint(4, 12))]
            group.samples.append(Sample(prompt, Completion(tokens, [-2.0] * len(tokens), [0] * len(tokens), "stop"),
                                        float(i % 2)))
        groups.append(group)
    return groups


def _trainer(precision: str, seed: int = 3, budget: int = 64) -> Trainer:
    config = load_config(overrides=["algo.batch_groups=3", "algo.group_size=4", "algo.lr=3e-3",
                                    f"train.micro_batch_tokens={budget}", f"train.precision={precision}"])
    model = random_model("tiny", torch.float32, CPU, seed=seed)
    return Trainer(model, config.algo, config.train, pad_id=0, autocast_dtype=torch.bfloat16)


def test_masters_stay_fp32_and_the_working_copy_is_their_cast_after_each_step():
    trainer = _trainer("masters")
    work = trainer.working
    assert work is not None and trainer.policy.lm is work.model
    before = [p.detach().clone() for p in trainer.model.parameters()]
    for seed in range(2):
        metrics = train_step(trainer, _groups(seed))
        assert metrics["micro_batches"] > 1  # gradients summed over several micro-batches
        for master, copy_ in zip(trainer.model.parameters(), work.model.parameters()):
            assert master.dtype == torch.float32 and copy_.dtype == torch.bfloat16
            assert torch.equal(copy_, master.detach().to(torch.bfloat16))
            assert copy_.grad is None and master.grad is None  # nothing held between steps
    assert all(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()) if a.numel() > 1)
    # The optimizer's state is fp32 and keyed by the masters.
    state = trainer.optimizer.state[next(trainer.model.parameters())]
    assert state["exp_avg"].dtype == torch.float32


def test_master_gradients_are_the_fp32_sum_of_the_working_copys_micro_batch_gradients():
    model = random_model("tiny", torch.float32, CPU, seed=3)
    shadow = copy.deepcopy(model).to(torch.bfloat16)  # the same bf16 weights, gradients left where autograd puts them
    work = WorkingCopy(model, torch.bfloat16)
    mbs = pack([s for g in _groups(0) for s in g.samples], 64, pad_id=0, device=CPU)
    assert len(mbs) > 1
    expected = [torch.zeros_like(p) for p in model.parameters()]
    for mb in mbs:
        for m in (work.model, shadow):
            logp, _ = token_logprobs(m, mb.input_ids, mb.attention_mask, mb.loss_mask, 1.0, 4)
            (logp.float() * mb.advantages[:, None]).sum().backward()
        for total, p in zip(expected, shadow.parameters()):
            total += p.grad.float()
        shadow.zero_grad(set_to_none=True)
    for master, copy_, total in zip(model.parameters(), work.params, expected):
        assert copy_.grad is None  # moved to the master as soon as it was complete
        assert master.grad.dtype == torch.float32
        torch.testing.assert_close(master.grad, total, rtol=0, atol=0)


def test_masters_learn_like_autocast_and_their_logprobs_stay_within_the_bf16_bound():
    autocast, masters = _trainer("autocast", budget=4096), _trainer("masters", budget=4096)
    groups = _groups(7, n_groups=2)
    losses = {"autocast": [], "masters": []}
    for _ in range(4):  # the same batch again and again: the loss falls
        losses["autocast"].append(train_step(autocast, copy.deepcopy(groups))["loss"])
        losses["masters"].append(train_step(masters, copy.deepcopy(groups))["loss"])
    for run in losses.values():
        assert run[-1] < run[0] - 0.02
    # Step by step the two follow each other to bf16 rounding.
    for a, b in zip(losses["autocast"], losses["masters"]):
        assert b == pytest.approx(a, abs=0.05 + 0.1 * abs(a))
    # The working copy's log-probs against the fp32 masters' own, on every trained token.
    mb = masters.pack(groups)[0][0]
    with torch.no_grad():
        bf16 = masters._logprobs(masters.model, mb)[0]
        masters.working = None  # the same trainer on its fp32 masters
        fp32 = masters._logprobs(masters.model, mb)[0]
    gap = (bf16 - fp32)[mb.loss_mask].abs()
    assert gap.mean() < BF16_MEAN and gap.max() < BF16_MAX, (gap.mean(), gap.max())


def test_a_restored_optimizer_state_refreshes_the_working_copy():
    trainer = _trainer("masters")
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(1.0)  # masters changed behind the copy's back, as a checkpoint restore does
    trainer.load_state_dict(trainer.state_dict())
    for master, work in zip(trainer.model.parameters(), trainer.working.model.parameters()):
        assert torch.equal(work, master.detach().to(torch.bfloat16))


def test_fp32_training_keeps_no_working_copy():
    config = load_config(overrides=["train.precision=masters"])
    model = random_model("tiny", torch.float32, CPU)
    assert Trainer(model, config.algo, config.train, pad_id=0).working is None
    assert working_copy(model, "autocast", torch.bfloat16, sharded=False) is None


@pytest.mark.parametrize("case, message", [
    ("float16", "needs model.train_dtype=bfloat16"),
    ("sharded", "runs in one process"),
    ("frozen", "for full fine-tuning"),
])
def test_unsupported_combinations_are_refused_in_one_line(case, message):
    model = random_model("tiny", torch.float32, CPU)
    if case == "frozen":
        next(model.parameters()).requires_grad_(False)
    dtype = torch.float16 if case == "float16" else torch.bfloat16
    with pytest.raises(UserError, match=message) as err:
        working_copy(model, "masters", dtype, sharded=case == "sharded")
    assert "\n" not in str(err.value)


def test_tied_weights_stay_one_parameter_in_the_copy():
    model = random_model("tiny", torch.float32, CPU)
    model.lm_head.weight = model.model.embed_tokens.weight
    work = WorkingCopy(model, torch.bfloat16)
    assert work.model.lm_head.weight is work.model.model.embed_tokens.weight
    assert len(work.params) == len(list(model.parameters()))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(passes=st.integers(1, 5), rows=st.integers(1, 6), tied=st.booleans())
def test_property_master_grads_are_the_fp32_sums_of_every_backward(passes, rows, tied):
    torch.manual_seed(passes * 100 + rows)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11))
    if tied:
        model[1].weight = model[0].weight
    shadow = copy.deepcopy(model).to(torch.bfloat16)
    work = WorkingCopy(model, torch.bfloat16)
    expected = [torch.zeros_like(p) for p in model.parameters()]
    for _ in range(passes):
        ids = torch.randint(0, 11, (rows,))
        for m in (work.model, shadow):
            m(ids).float().square().sum().backward()
        for total, p in zip(expected, shadow.parameters()):
            total += p.grad.float()
        shadow.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in work.params)
    for master, total in zip(model.parameters(), expected):
        torch.testing.assert_close(master.grad, total, rtol=0, atol=0)
