"""The CPU's inverse-CDF sampler (generation/sampling.py): the softmax's distribution (chi-square),
exact log-probs, never a word of zero weight, the block tiling, the seed, and which sampler the
engine takes where."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from aioareal.generation.sampling import (
    SamplingParams,
    block_size,
    fused_sample,
    inverse_cdf_sample,
    sample,
    sampler_for,
)

NEG = float("-inf")


def test_tokens_follow_the_temperature_scaled_softmax_and_skip_impossible_words():
    """Chi-square over 60,000 draws from 6 possible words (p = 0.001 at 5 degrees of freedom: 20.5)."""
    logits = torch.tensor([[2.0, 1.0, NEG, 0.5, 0.0, -1.0, -3.0, NEG]])
    draws = 60_000
    tok, lp = inverse_cdf_sample(logits.expand(draws, -1), SamplingParams(temperature=0.8),
                                 torch.Generator().manual_seed(3))
    probs = torch.softmax(logits / 0.8, dim=-1)[0]
    observed = torch.bincount(tok, minlength=8).double()
    assert observed[2] == 0 and observed[7] == 0
    possible = probs > 0
    expected = probs.double()[possible] * draws
    assert ((observed[possible] - expected) ** 2 / expected).sum() < 20.5
    torch.testing.assert_close(lp, probs.log()[tok])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_log_probs_are_the_chosen_words_under_the_full_distribution(dtype):
    logits = (3 * torch.randn(16, 49152, generator=torch.Generator().manual_seed(0))).to(dtype)
    tok, lp = inverse_cdf_sample(logits, SamplingParams(temperature=0.7), torch.Generator().manual_seed(1))
    expected = torch.log_softmax(logits.float() / 0.7, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
    assert tok.dtype == torch.int64 and lp.dtype == torch.float32
    torch.testing.assert_close(lp, expected, atol=5e-5, rtol=1e-5)


def test_a_word_of_zero_weight_is_never_drawn_wherever_the_mass_sits():
    """One possible word per row, placed at each end of the row and of a block, with empty blocks
    before it (a draw of u = 0 must not land in them): every draw is that word."""
    vocab = 400  # blocks of 20
    rows = torch.full((6, vocab), NEG)
    words = [0, 19, 20, 199, 380, 399]
    for i, w in enumerate(words):
        rows[i, w] = 0.0
    for seed in range(20):
        tok, lp = inverse_cdf_sample(rows, SamplingParams(), torch.Generator().manual_seed(seed))
        assert tok.tolist() == words and torch.equal(lp, torch.zeros(6))


@given(st.integers(min_value=1, max_value=200_000))
def test_blocks_tile_the_vocabulary(vocab):
    size = block_size(vocab)
    assert vocab % size == 0 and size * size >= vocab
    assert all(vocab % d for d in range(1, size) if d * d >= vocab)  # the smallest such divisor


def test_the_seed_reproduces_the_draw_and_another_changes_it():
    logits = torch.randn(32, 1000, generator=torch.Generator().manual_seed(0))
    a = inverse_cdf_sample(logits, SamplingParams(), torch.Generator().manual_seed(1))[0]
    assert torch.equal(a, inverse_cdf_sample(logits, SamplingParams(), torch.Generator().manual_seed(1))[0])
    assert not torch.equal(a, inverse_cdf_sample(logits, SamplingParams(), torch.Generator().manual_seed(2))[0])


@pytest.mark.parametrize("params", [SamplingParams(greedy=True), SamplingParams(temperature=0.7, top_p=0.8)])
def test_greedy_and_top_p_are_samples(params):
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(0))
    got = inverse_cdf_sample(logits, params, torch.Generator().manual_seed(4))
    ref = sample(logits, params, torch.Generator().manual_seed(4))
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_the_engine_samples_by_inverse_cdf_on_the_cpu_and_by_the_race_on_a_gpu():
    assert sampler_for(torch.device("cpu"), False) is inverse_cdf_sample
    assert sampler_for(torch.device("cuda"), False) is sample
    assert sampler_for(torch.device("cpu"), True) is fused_sample
