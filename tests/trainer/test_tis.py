"""Truncated importance sampling on the engine/trainer mismatch (algo.tis_cap, Yao et al. 2025): the
pure weights against hand values and a property, then the wiring in a trainer step."""
from __future__ import annotations

import math

import pytest
import torch
from hand_groups import groups_with_behaviour, known_shift, trainer_for
from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal import losses
from aioareal.config import load_config
from aioareal.errors import ConfigError
from aioareal.trainer import train_step
from aioareal.trainer.trainer import assign_advantages

PROPS = settings(deadline=None, max_examples=40, derandomize=True)


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_tis_weight_hand_values():
    # pi_old / pi_behav = e^1, e^-1, e^0.5, 1: capped at 2 -> 2, 1/e, sqrt(e) (1.6487 < 2), 1.
    w = losses.tis_weight(t([-1.0, -2.0, -0.5, -3.0]), t([-2.0, -1.0, -1.0, -3.0]), cap=2.0)
    torch.testing.assert_close(w, t([2.0, math.exp(-1), math.exp(0.5), 1.0]))
    # A cap below 1 bounds every weight under it, even where the trainer agrees with the engine.
    torch.testing.assert_close(losses.tis_weight(t([-1.0, -3.0]), t([-1.0, -2.0]), 0.5), t([0.5, math.exp(-1)]))


def test_tis_behaviour_logp_hand_values():
    # max(log pi_behav, log pi_old - log C) with C = e: old - 1 = [-2, -3]; behav [-2.5, -1] -> [-2, -1].
    out = losses.tis_behaviour_logp(t([-1.0, -2.0]), t([-2.5, -1.0]), cap=math.e)
    torch.testing.assert_close(out, t([-2.0, -1.0]))
    behav = t([-2.5, -1.0, -40.0])
    assert torch.equal(losses.tis_behaviour_logp(t([-1.0, -2.0, 0.0]), behav, math.inf), behav)  # inf: untouched


@PROPS
@given(rows=st.integers(1, 12).flatmap(lambda n: st.tuples(*[st.lists(st.floats(-20, 0, allow_subnormal=False),
                                                                         min_size=n, max_size=n)] * 3)),
       log_cap=st.floats(-3, 3))
def test_ppo_ratio_under_tis_is_the_trust_region_ratio_times_the_truncated_weight(rows, log_cap):
    """r = pi / pi_behav' = (pi / pi_old) * min(pi_old / pi_behav, C), and the weight is at most C."""
    logp, old, behav = (t(r) for r in rows)
    cap = math.exp(log_cap)
    w = losses.tis_weight(old, behav, cap)
    ratio = torch.exp(logp - losses.tis_behaviour_logp(old, behav, cap))
    torch.testing.assert_close(ratio, torch.exp(logp - old) * w, rtol=1e-9, atol=0)
    assert (w <= cap * (1 + 1e-12)).all() and (w > 0).all()


def test_decoupled_refuses_tis_cap_naming_the_key():
    with pytest.raises(ConfigError, match="config key 'algo.tis_cap': the decoupled objective already weights"):
        load_config(overrides=["algo.objective=decoupled", "algo.tis_cap=2"])
    with pytest.raises(ConfigError, match="'algo.tis_cap': must be > 0"):
        load_config(overrides=["algo.tis_cap=0"])
    assert load_config(overrides=["algo.tis_cap=inf"]).algo.tis_cap == math.inf
    assert load_config().algo.tis_cap is None  # off by default


def test_ppo_tis_cap_inf_equals_off():
    """Several updates (so the start-of-step log-probs come from the extra forward) and behaviour
    log-probs off by up to 0.45: the same loss and the same weights as without the option."""
    results = []
    for extra in ([], ["algo.tis_cap=inf"]):
        trainer = trainer_for("ppo", "algo.minibatches=2", "algo.ppo_epochs=2", *extra)
        metrics = train_step(trainer, groups_with_behaviour(trainer.model, known_shift))
        results.append((metrics, [p.detach().clone() for p in trainer.model.parameters()]))
    (off, off_params), (inf, inf_params) = results
    assert inf["loss"] == pytest.approx(off["loss"], rel=1e-6) and inf["tis_capped_frac"] == 0.0
    for a, b in zip(off_params, inf_params):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def one_update(objective: str, *overrides: str):
    """One update of a fresh trainer on groups whose behaviour log-probs are 0.1 below the trainer's
    (pi_old / pi_behav = e^0.1 > 1 on every token); returns the metrics and the advantages per token."""
    trainer = trainer_for(objective, "algo.grad_clip=0", *overrides)
    groups = groups_with_behaviour(trainer.model, lambda *_: -0.1)
    assign_advantages(groups, std_norm=True)
    adv = torch.tensor([s.advantage for g in groups for s in g.samples for _ in s.tokens], dtype=torch.float64)
    return train_step(trainer, groups), adv


def test_dg_tis_cap_below_one_scales_the_loss_and_gradient_by_the_cap():
    """Every weight min(e^0.1, 0.5) is the cap: DG's loss and its gradient are exactly half of plain DG's."""
    off, _ = one_update("dg")
    capped, _ = one_update("dg", "algo.tis_cap=0.5")
    assert capped["loss"] == pytest.approx(0.5 * off["loss"], rel=1e-5)
    assert capped["grad_norm"] == pytest.approx(0.5 * off["grad_norm"], rel=1e-5)
    assert capped["tis_capped_frac"] == 1.0


def test_ppo_tis_cap_below_one_by_hand():
    """Before the update pi = pi_old, so r = min(e^0.1, 0.5) = 0.5 on every token. PPO's loss per
    token is max(-0.5 A, -clip(0.5, 0.8, 1.2) A): -0.5 A where A > 0, -0.8 A (clipped, no gradient)
    where A < 0. Plain ppo has r = e^0.1, inside the clip range: loss -e^0.1 A, nothing clipped."""
    capped, adv = one_update("ppo", "algo.tis_cap=0.5")
    hand = torch.where(adv > 0, -0.5 * adv, -0.8 * adv).mean()
    assert capped["loss"] == pytest.approx(float(hand), abs=1e-6)
    assert capped["clip_frac"] == pytest.approx(float((adv < 0).double().mean()))
    off, _ = one_update("ppo")
    assert off["loss"] == pytest.approx(float((-math.exp(0.1) * adv).mean()), abs=1e-6) and off["clip_frac"] == 0
