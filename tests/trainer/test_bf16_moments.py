"""AdamW with bf16 moments (trainer/optim.py): stochastic rounding is unbiased and lands on
a neighbour, it keeps the second moment moving where rounding to nearest freezes it, the update
follows torch's AdamW, and a restored state continues exactly as the uninterrupted optimizer."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal.trainer.optim import AdamWBf16Moments, random_low_bits, round_stochastically


def neighbours(x: float) -> tuple[float, float]:
    """The bf16 values at or below and at or above |x|, with x's sign."""
    down = torch.tensor([x]).view(torch.int32).bitwise_and(-65536).view(torch.float32)
    up = (down.view(torch.int32) + 65536).view(torch.float32)
    return float(down), float(up)


@settings(deadline=None, max_examples=40)
@given(st.floats(-1e30, 1e30, allow_nan=False, allow_subnormal=False).filter(lambda v: abs(v) > 1e-30))
def test_stochastic_rounding_lands_on_a_neighbour_and_is_unbiased(x: float) -> None:
    x = float(torch.tensor(x, dtype=torch.float32))
    values = torch.full((20_000,), x)
    out = torch.empty(20_000, dtype=torch.bfloat16)
    round_stochastically(values, out, random_low_bits(values, torch.Generator().manual_seed(0)))
    rounded = out.double()
    low, high = neighbours(x)
    assert set(rounded.unique().tolist()) <= {low, high}
    if low != high:  # the mean lies within a few standard errors of x, in units of the gap
        gap = abs(high - low)
        assert abs(rounded.mean().item() - x) / gap < 5 * 0.5 / 20_000 ** 0.5


def test_stochastic_rounding_keeps_the_second_moment_moving_where_nearest_freezes_it() -> None:
    """g^2 = 1.3 v at beta2 = 0.99: each step moves v by 0.3% of itself, under half a bf16 step."""
    beta2, target, steps = 0.99, 1.3, 300
    exact = torch.ones(4096)
    nearest = torch.ones(4096, dtype=torch.bfloat16)
    stochastic = torch.ones(4096, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        exact.mul_(beta2).add_(target * (1 - beta2))
        nearest.copy_(nearest.float().mul_(beta2).add_(target * (1 - beta2)))
        moved = stochastic.float().mul_(beta2).add_(target * (1 - beta2))
        round_stochastically(moved, stochastic, random_low_bits(moved, generator))
    assert torch.all(nearest == 1.0)  # frozen where it started
    assert abs(stochastic.float().mean().item() - exact.mean().item()) < 0.01 * exact.mean().item()


def problem(seed: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    x = torch.randn(256, 32, generator=g)
    return model, x, torch.sin(x[:, :1] * 2) + x[:, 1:2]


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_the_update_follows_torch_adamw() -> None:
    reference, x, y = problem(0)
    ours = copy.deepcopy(reference)
    settings_ = {"lr": 3e-3, "betas": (0.9, 0.99), "weight_decay": 0.01}
    expected = train(reference, torch.optim.AdamW(reference.parameters(), **settings_), x, y, 300)
    got = train(ours, AdamWBf16Moments(ours.parameters(), **settings_), x, y, 300)
    assert expected[-1] < 0.5 * expected[0]  # it learns
    assert abs(got[-1] - expected[-1]) < 0.05 * expected[0], (got[-1], expected[-1])
    first = AdamWBf16Moments(ours.parameters(), **settings_)
    train(ours, first, x, y, 1)
    assert all(s[k].dtype == torch.bfloat16 for s in first.state.values() for k in ("exp_avg", "exp_avg_sq"))
    # The first step's update is AdamW's to bf16 rounding: lr * sign(g), moments start at zero.
    a, _, _ = problem(1)
    b = copy.deepcopy(a)
    train(a, torch.optim.AdamW(a.parameters(), **settings_), x, y, 1)
    train(b, AdamWBf16Moments(b.parameters(), **settings_), x, y, 1)
    assert all(torch.allclose(p, q, atol=1e-5) for p, q in zip(a.parameters(), b.parameters()))


def test_a_restored_state_continues_exactly_as_the_uninterrupted_run() -> None:
    unbroken, x, y = problem(2)
    broken = copy.deepcopy(unbroken)
    train(unbroken, AdamWBf16Moments(unbroken.parameters(), lr=1e-2, seed=7), x, y, 20)
    first = AdamWBf16Moments(broken.parameters(), lr=1e-2, seed=7)
    train(broken, first, x, y, 12)
    saved = copy.deepcopy(first.state_dict())
    restored = AdamWBf16Moments(broken.parameters(), lr=1e-2, seed=7)
    restored.load_state_dict(saved)
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in restored.state.values())
    train(broken, restored, x, y, 8)
    assert all(torch.equal(p, q) for p, q in zip(unbroken.parameters(), broken.parameters()))


def test_a_run_keeps_bf16_moments_in_its_checkpoint_and_resumes_as_the_unbroken_run(tmp_path, tiny_model_path):
    from aioareal.checkpoint import latest_checkpoint
    from aioareal.checkpoint.atomic import load_trainer_state
    from aioareal.config import load_config
    from aioareal.run.recipe import resume
    from aioareal.run.recipe import train as train_run

    keys = ["train.optimizer_moments=bfloat16", "run.checkpoint_every=1", "eval.every=0", "algo.batch_groups=4",
            "algo.group_size=4"]

    def start(name: str, steps: int):
        config = load_config(overrides=[*keys, f"train.steps={steps}"], flags={"run.run_dir": str(tmp_path / name)})
        return train_run(config, log=lambda *_: None, printer=lambda row: None)

    unbroken, broken = start("unbroken", 4), start("broken", 2)
    state = load_trainer_state(latest_checkpoint(broken), torch.device("cpu"))["optimizer"]["state"]
    assert state and all(s[k].dtype == torch.bfloat16 for s in state.values() for k in ("exp_avg", "exp_avg_sq"))
    resume(broken, ["train.steps=4"], log=lambda *_: None, printer=lambda row: None)
    compared = ("step", "reward_mean", "loss", "grad_norm")
    rows = [[[json.loads(line).get(k) for k in compared] for line in (d / "metrics.jsonl").read_text().splitlines()]
            for d in (unbroken, broken)]
    assert rows[0] == rows[1] and len(rows[0]) == 5


def test_bf16_moments_are_refused_under_torchrun() -> None:
    from aioareal.config import AlgoConfig
    from aioareal.errors import UserError
    from aioareal.trainer.optim import build_optimizer

    params = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(UserError, match="train.optimizer_moments=bfloat16 runs in one process"):
        build_optimizer(params, AlgoConfig(), "bfloat16", sharded=True)
    assert isinstance(build_optimizer(params, AlgoConfig(), "bfloat16", sharded=False), AdamWBf16Moments)


def test_a_forced_resume_may_switch_the_moments_dtype_either_way() -> None:
    """`--resume --force train.optimizer_moments=...`: each optimizer loads the other's state."""
    model, x, y = problem(3)
    fp32 = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, fp32, x, y, 3)
    ours = AdamWBf16Moments(model.parameters(), lr=1e-2)
    ours.load_state_dict(copy.deepcopy(fp32.state_dict()))
    assert all(s["exp_avg_sq"].dtype == torch.bfloat16 and float(s["step"]) == 3 for s in ours.state.values())
    train(model, ours, x, y, 2)
    back = torch.optim.AdamW(model.parameters(), lr=1e-2)
    back.load_state_dict(copy.deepcopy(ours.state_dict()))
    assert all(s["exp_avg_sq"].dtype == torch.float32 and float(s["step"]) == 5 for s in back.state.values())
    train(model, back, x, y, 1)
