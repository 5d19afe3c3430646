"""Unit tests of aioareal.losses against hand-computed values, plus property tests of invariants.

Hand values are worked out in the comments; eps_low=0.2 and eps_high=0.28 differ on purpose so a
swapped bound shows up.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from aioareal import losses

PROPS = settings(deadline=None, max_examples=40, derandomize=True)
LOW, HIGH = 0.2, 0.28
LN = math.log


def t(values, dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def close(actual: torch.Tensor, expected, atol: float = 1e-4) -> None:
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# ---------------------------------------------------------------- group advantages

def test_group_advantages_hand_values():
    # group 0: [1,0,0,1]: mean 0.5, centred +-0.5, unbiased std sqrt(4*0.25/3) = 0.5774 -> +-0.8660
    # group 1: [0,0,0,3]: mean 0.75, centred [-.75]*3 + [2.25], var (3*.5625 + 5.0625)/3 = 2.25,
    #          std 1.5 -> [-0.5, -0.5, -0.5, 1.5]
    rewards = t([[1, 0, 0, 1], [0, 0, 0, 3]])
    close(losses.group_advantages(rewards), [[0.8660, -0.8660, -0.8660, 0.8660], [-0.5, -0.5, -0.5, 1.5]])
    # Dr. GRPO: no std division, just centred rewards.
    close(losses.group_advantages(rewards, std_norm=False), [[0.5, -0.5, -0.5, 0.5], [-0.75, -0.75, -0.75, 2.25]])


@pytest.mark.parametrize("std_norm", [True, False])
def test_group_advantages_constant_and_singleton_groups_are_exactly_zero(std_norm):
    # 0.1 is not exact in binary; the mean of three of them may miss by an ulp, which eps would amplify.
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        rewards = torch.tensor([[0.1, 0.1, 0.1], [2.0, 2.0, 2.0]], dtype=dtype)
        adv = losses.group_advantages(rewards, std_norm)
        assert adv.dtype == dtype and torch.equal(adv, torch.zeros_like(adv))
    single = losses.group_advantages(t([[3.0], [-1.0]]), std_norm)  # G = 1: std is NaN in torch
    assert torch.equal(single, torch.zeros_like(single))


rewards_strategy = st.integers(1, 4).flatmap(lambda groups: st.integers(2, 8).flatmap(
    lambda g: st.lists(st.lists(st.floats(-100, 100, allow_subnormal=False), min_size=g, max_size=g),
                       min_size=groups, max_size=groups)))


def _well_spread(rows: list[list[float]], spread: float = 1e-2) -> bool:
    """Every group is either constant or spread enough that rounding cannot fake a signal."""
    return all(max(r) == min(r) or max(r) - min(r) > spread for r in rows)


@PROPS
@given(rewards_strategy, st.booleans())
def test_group_advantages_have_zero_mean(rows, std_norm):
    adv = losses.group_advantages(t(rows), std_norm)
    close(adv.mean(dim=-1), torch.zeros(len(rows)), atol=1e-6)


@PROPS
@given(rewards_strategy)
def test_group_advantages_have_unit_std(rows):
    assume(_well_spread(rows))
    rewards = t(rows)
    adv = losses.group_advantages(rewards)
    varied = rewards.amax(-1) > rewards.amin(-1)
    # std(A) = s / (s + eps) with s >= ~3.5e-3 here, so within 1e-3 of 1.
    torch.testing.assert_close(adv.std(dim=-1)[varied], torch.ones(int(varied.sum())), atol=1e-3, rtol=0,
                               check_dtype=False)


@PROPS
@given(rewards_strategy, st.floats(-100, 100), st.floats(0.01, 100), st.booleans())
def test_group_advantages_invariant_to_shift_and_scale(rows, shift, scale, std_norm):
    assume(_well_spread(rows))
    rewards = t(rows)
    base = losses.group_advantages(rewards, std_norm, eps=0.0)
    torch.testing.assert_close(losses.group_advantages(rewards + shift, std_norm, eps=0.0), base)
    if std_norm:  # without std division the advantages scale with the rewards
        torch.testing.assert_close(losses.group_advantages(rewards * scale, std_norm, eps=0.0), base)


# ---------------------------------------------------------------- PPO

def _ppo_case():
    # (A, ratio) -> loss = max(-r A, -clip(r, 0.8, 1.28) A), clipped when the second is strictly larger
    #  A=+1 r=1.5: max(-1.5, -1.28) = -1.28  clipped   (too far up on a good action)
    #  A=+1 r=0.5: max(-0.5, -0.8)  = -0.5   not       (pessimism keeps the gradient)
    #  A=-1 r=1.5: max( 1.5,  1.28) =  1.5   not
    #  A=-1 r=0.5: max( 0.5,  0.8)  =  0.8   clipped   (too far down on a bad action)
    #  A=+2 r=1.1: inside the band  = -2.2   not
    #  A=-2 r=0.9: inside the band  =  1.8   not
    adv = t([1.0, 1.0, -1.0, -1.0, 2.0, -2.0])
    ratio = t([1.5, 0.5, 1.5, 0.5, 1.1, 0.9])
    behav = t([[LN(0.4)] * 6]).T  # (6, 1)
    logp = (behav + ratio.log().unsqueeze(-1)).requires_grad_()
    return logp, behav, adv, ratio


def test_ppo_clipping_branches():
    logp, behav, adv, ratio = _ppo_case()
    loss, clipped = losses.ppo_token_loss(logp, behav, adv, LOW, HIGH)
    close(loss[:, 0], [-1.28, -0.5, 1.5, 0.8, -2.2, 1.8])
    assert clipped[:, 0].tolist() == [True, False, False, True, False, False]
    # d/dlogp of -r A is -r A; the clipped branch is constant in logp.
    loss.sum().backward()
    close(logp.grad[:, 0], [0.0, -0.5, 1.5, 0.0, -2.2, 1.8])


def test_ppo_per_sequence_advantage_broadcasts():
    torch.manual_seed(0)
    logp, behav, adv = torch.randn(3, 5), torch.randn(3, 5), torch.randn(3)
    per_seq = losses.ppo_token_loss(logp, behav, adv, LOW, HIGH)
    per_tok = losses.ppo_token_loss(logp, behav, adv.unsqueeze(-1).expand(3, 5), LOW, HIGH)
    assert torch.equal(per_seq[0], per_tok[0]) and torch.equal(per_seq[1], per_tok[1])


logps = st.floats(-8, 0)
ppo_rows = st.lists(st.tuples(logps, logps, st.floats(-5, 5)), min_size=1, max_size=16)


@PROPS
@given(ppo_rows, st.floats(0.0, 0.5), st.floats(0.0, 0.5))
def test_ppo_properties(rows, eps_low, eps_high):
    logp = t([[r[0]] for r in rows]).requires_grad_()
    behav, adv = t([[r[1]] for r in rows]), t([r[2] for r in rows])
    loss, clipped = losses.ppo_token_loss(logp, behav, adv, eps_low, eps_high)
    ratio, a = (logp - behav).exp().detach(), adv.unsqueeze(-1)
    assert (loss >= -ratio * a - 1e-12).all()  # pessimistic: never better than the unclipped term
    assert (loss >= -(1 + eps_high) * a.abs() - 1e-12).all()  # gains are bounded by the clip
    outside = (ratio < 1 - eps_low) | (ratio > 1 + eps_high)
    assert not (clipped & ~outside).any()  # only ratios outside the band are ever clipped
    loss.sum().backward()
    close(logp.grad, torch.where(clipped, 0.0, -ratio * a), atol=1e-9)
    on_policy, on_clipped = losses.ppo_token_loss(behav, behav, adv, eps_low, eps_high)
    close(on_policy, -a.expand_as(on_policy), atol=1e-12)  # ratio 1: loss = -A, never clipped
    assert not on_clipped.any()


# ---------------------------------------------------------------- decoupled PPO (AReaL eq. 5)

def test_decoupled_hand_values():
    # behav 0.5, prox 0.6 -> w = 1.2. A = 1.
    #  pi = 0.66: u = 1.1 inside the band -> -1.2 * 1.1  = -1.32
    #  pi = 0.90: u = 1.5 > 1.28, clipped  -> -1.2 * 1.28 = -1.536
    behav, prox = t([[LN(0.5), LN(0.5)]]), t([[LN(0.6), LN(0.6)]])
    logp = t([[LN(0.66), LN(0.9)]])
    loss, clipped, capped = losses.decoupled_token_loss(logp, prox, behav, t([1.0]), LOW, HIGH)
    close(loss, [[-1.32, -1.536]])
    assert clipped.tolist() == [[False, True]] and not capped.any()


@PROPS
@given(ppo_rows)
def test_decoupled_with_prox_equal_behav_is_ppo(rows):
    logp, behav, adv = t([[r[0]] for r in rows]), t([[r[1]] for r in rows]), t([r[2] for r in rows])
    loss, clipped, capped = losses.decoupled_token_loss(logp, behav, behav, adv, LOW, HIGH)
    ppo_loss, ppo_clipped = losses.ppo_token_loss(logp, behav, adv, LOW, HIGH)
    torch.testing.assert_close(loss, ppo_loss)
    assert torch.equal(clipped, ppo_clipped) and not capped.any()


def test_decoupled_cap_mask_vs_clamp():
    # token 0: behav 0.1, prox 0.8 -> w = 8 > cap 5; token 1: behav 0.5, prox 0.6 -> w = 1.2.
    # pi = prox (u = 1), A = 1: the surrogate is -1 per token before the weight.
    behav, prox = t([[LN(0.1), LN(0.5)]]), t([[LN(0.8), LN(0.6)]]).requires_grad_()
    for mode, expected, grad in (("mask", [[0.0, -1.2]], [[0.0, -1.2]]), ("clamp", [[-5.0, -1.2]], [[-5.0, -1.2]])):
        logp = prox.detach().clone().requires_grad_()
        loss, _, capped = losses.decoupled_token_loss(logp, prox, behav, t([1.0]), LOW, HIGH, 5.0, mode)
        close(loss, expected)
        assert capped.tolist() == [[True, False]]
        loss.sum().backward()
        close(logp.grad, grad)  # d/dlogp of -w u A = -w u A at u = 1
    assert prox.grad is None  # the behaviour weight and the trust-region centre carry no gradient


@PROPS
@given(ppo_rows)
def test_one_update_decoupled_is_ppo_without_its_clip(rows):
    """The objectives-tiny finding as a property: at the only update of a step (one mini-batch, one
    epoch) pi == pi_prox, so decoupled's own clip never acts and its gradient is w A per token for
    every w under the cap; PPO's gradient is the same w A except on the tokens its clip around the
    behaviour policy zeroes. Stale samples put ~11% of tokens there at K=8 (plots/objectives-tiny)."""
    logp, behav, adv = t([[r[0]] for r in rows]), t([[r[1]] for r in rows]), t([r[2] for r in rows])
    dec_logp, ppo_logp = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    loss, dec_clipped, capped = losses.decoupled_token_loss(dec_logp, logp, behav, adv, LOW, HIGH, 1e9)
    loss.sum().backward()
    ppo_loss, ppo_clipped = losses.ppo_token_loss(ppo_logp, behav, adv, LOW, HIGH)
    ppo_loss.sum().backward()
    w_adv = -(logp - behav).exp() * adv[:, None]  # d/dlogp of -w u A at u = 1
    assert not dec_clipped.any() and not capped.any()
    torch.testing.assert_close(dec_logp.grad, w_adv)
    torch.testing.assert_close(ppo_logp.grad, torch.where(ppo_clipped, torch.zeros_like(w_adv), w_adv))


def test_decoupled_rejects_unknown_cap_mode():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="cap_mode"):
        losses.decoupled_token_loss(x, x, x, torch.ones(1), LOW, HIGH, cap_mode="clip")


# ---------------------------------------------------------------- Delightful PG

def test_dg_gate_and_gradient_hand_values():
    # A=+1, pi=0.5 : l = 0.6931, chi = 0.6931, w = 1/(1+e^-0.6931) = 1/(1+0.5) = 0.6667, loss = 0.6667*0.6931 = 0.4621
    # A=-1, pi=0.5 : chi = -0.6931, w = 1/(1+2) = 0.3333, loss = -(0.3333*-1)*(-0.6931) = -0.2310
    # A=+1, pi=0.25, eta=2 is checked below: chi/eta = 1.3863/2 = 0.6931 -> w = 0.6667
    # A=0          : w = 0.5, loss 0; pi=1 (l = 0): w = 0.5
    logp = t([[LN(0.5), LN(0.5), LN(0.5), 0.0]]).T.requires_grad_()  # (4, 1)
    adv = t([1.0, -1.0, 0.0, 1.0])
    loss, gate = losses.dg_token_loss(logp, adv)
    close(gate[:, 0], [2 / 3, 1 / 3, 0.5, 0.5])
    close(loss[:, 0], [0.4621, -0.2310, 0.0, 0.0])
    loss.sum().backward()
    close(logp.grad[:, 0], [-2 / 3, 1 / 3, 0.0, -0.5])  # = -w A: the gate is a stop-gradient weight
    _, gate_eta = losses.dg_token_loss(t([[LN(0.25)]]), t([1.0]), eta=2.0)
    close(gate_eta, [[2 / 3]])


@PROPS
@given(st.lists(st.tuples(st.floats(-10, -1e-3), st.floats(-5, 5)), min_size=1, max_size=16),
       st.floats(0.1, 4.0))
def test_dg_properties(rows, eta):
    logp = t([[r[0]] for r in rows]).requires_grad_()
    adv = t([r[1] for r in rows])
    loss, gate = losses.dg_token_loss(logp, adv, eta)
    assert ((gate >= 0) & (gate <= 1)).all() and not gate.requires_grad  # sigmoid saturates in floats
    a = adv.unsqueeze(-1)
    assert ((gate - 0.5) * a >= 0).all()  # surprisal l > 0 here: the gate opens for A > 0, damps A < 0
    loss.sum().backward()
    close(logp.grad, -gate * a, atol=1e-12)


# ---------------------------------------------------------------- k3 KL

def test_k3_hand_values():
    # equal -> 0. d = ref - logp:
    #  ref 0.5, pi 0.25: d = +0.6931 -> 2 - 0.6931 - 1   = 0.3069
    #  ref 0.25, pi 0.5: d = -0.6931 -> 0.5 + 0.6931 - 1 = 0.1931
    logp, ref = t([LN(0.3), LN(0.25), LN(0.5)]), t([LN(0.3), LN(0.5), LN(0.25)])
    close(losses.k3_kl(logp, ref), [0.0, 0.3069, 0.1931])


@PROPS
@given(st.lists(st.tuples(logps, logps), min_size=1, max_size=16))
def test_k3_nonnegative_and_zero_only_when_equal(rows):
    logp, ref = t([r[0] for r in rows]), t([r[1] for r in rows])
    kl = losses.k3_kl(logp, ref)
    d = [r[1] - r[0] for r in rows]  # log pi_ref - log pi
    close(kl, [math.exp(x) - x - 1 for x in d], atol=1e-9)
    assert all(k > 0 for k, x in zip(kl.tolist(), d) if abs(x) > 1e-6)  # below that, k3 ~ x^2/2 rounds off
    assert torch.equal(losses.k3_kl(logp, logp), torch.zeros_like(logp))


# ---------------------------------------------------------------- aggregation

# Ragged batch: 100s sit in padding and must never leak in.
PER_TOKEN = t([[1, 2, 3, 4], [5, 6, 100, 100], [7, 100, 100, 100]])
MASK = t([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])


def test_aggregate_modes_hand_values():
    # masked row sums 10, 11, 7 = 28 over 7 tokens and 3 sequences
    close(losses.aggregate(PER_TOKEN, MASK, "token-mean"), 28 / 7)  # 4.0
    close(losses.aggregate(PER_TOKEN, MASK, "seq-mean"), (10 / 4 + 11 / 2 + 7 / 1) / 3)  # 5.0
    close(losses.aggregate(PER_TOKEN, MASK, "constant", constant=8), 28 / (3 * 8))  # 1.1667
    close(losses.aggregate(PER_TOKEN, MASK.bool(), "token-mean"), 4.0)  # a bool mask works too


def test_aggregate_micro_batches_sum_to_whole_batch():
    # micro-batches of different widths, as the packer makes them: rows {0, 1} and {2} (width 1)
    parts = [(PER_TOKEN[:2], MASK[:2]), (PER_TOKEN[2:, :1], MASK[2:, :1])]
    for mode in losses.AGG_MODES:
        whole = losses.aggregate(PER_TOKEN, MASK, mode, constant=8)
        summed = sum(losses.aggregate(p, m, mode, total_tokens=7.0, total_seqs=3.0, constant=8) for p, m in parts)
        close(summed, whole, atol=1e-12)


@PROPS
@given(st.lists(st.integers(0, 6), min_size=2, max_size=8), st.integers(1, 7), st.data())
def test_aggregate_split_property(lengths, cut, data):
    cut = min(cut, len(lengths) - 1)
    width = max(max(lengths), 1)
    per_token = t(data.draw(st.lists(st.lists(st.floats(-10, 10), min_size=width, max_size=width),
                                     min_size=len(lengths), max_size=len(lengths))))
    mask = (torch.arange(width) < t(lengths).unsqueeze(-1)).double()
    totals = dict(total_tokens=float(mask.sum().clamp(min=1)), total_seqs=float(len(lengths)), constant=16.0)
    for mode in losses.AGG_MODES:
        whole = losses.aggregate(per_token, mask, mode, constant=16.0)
        summed = (losses.aggregate(per_token[:cut], mask[:cut], mode, **totals)
                  + losses.aggregate(per_token[cut:], mask[cut:], mode, **totals))
        close(summed, whole, atol=1e-9)


def test_aggregate_empty_mask_is_zero_not_nan():
    for mode in losses.AGG_MODES:
        close(losses.aggregate(PER_TOKEN, torch.zeros_like(MASK), mode, constant=8), 0.0)


def test_aggregate_errors_name_the_problem():
    with pytest.raises(ValueError, match="'mean'"):
        losses.aggregate(PER_TOKEN, MASK, "mean")
    with pytest.raises(ValueError, match="constant"):
        losses.aggregate(PER_TOKEN, MASK, "constant")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_losses_keep_the_input_dtype(dtype):
    logp, behav = torch.full((2, 3), -1.0, dtype=dtype), torch.full((2, 3), -1.1, dtype=dtype)
    adv = torch.ones(2, dtype=dtype)
    outs = [losses.ppo_token_loss(logp, behav, adv, LOW, HIGH)[0],
            losses.decoupled_token_loss(logp, behav, behav, adv, LOW, HIGH)[0],
            losses.dg_token_loss(logp, adv)[0], losses.k3_kl(logp, behav),
            losses.group_advantages(torch.tensor([[1.0, 0.0]], dtype=dtype))]
    outs += [losses.aggregate(outs[0], torch.ones(2, 3), mode, constant=4) for mode in losses.AGG_MODES]
    assert all(o.dtype == dtype and torch.isfinite(o).all() for o in outs)


# ---------------------------------------------------------------- gradient clipping

def _params_with_grads() -> list[torch.nn.Parameter]:
    # grads [3, 0] and [4]: total L2 norm 5
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    a.grad, b.grad = t([3.0, 0.0], torch.float32), t([4.0], torch.float32)
    return [a, b]


def test_grad_norm_clip_returns_pre_clip_norm_and_clips():
    a, b = _params_with_grads()
    norm = losses.grad_norm_clip(iter([a, b]), 1.0)  # a generator works, as model.parameters() is one
    assert isinstance(norm, torch.Tensor)
    close(norm, 5.0)
    close(a.grad, [0.6, 0.0])  # scaled by 1/5
    close(b.grad, [0.8])


@pytest.mark.parametrize("max_norm", [0.0, 10.0])
def test_grad_norm_clip_leaves_small_or_unclipped_grads(max_norm):
    a, b = _params_with_grads()
    close(losses.grad_norm_clip([a, b], max_norm), 5.0)  # 0 disables clipping, still reports the norm
    close(a.grad, [3.0, 0.0])
    close(b.grad, [4.0])
