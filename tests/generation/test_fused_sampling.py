"""The fused sampler (generation/sampling.py) against `sample`: the same tokens for the same
generator state on the CPU, the softmax's distribution (chi-square), greedy and top_p, and the
config switch. Most tests run the eager `race` (what inductor compiles); one compiles it."""
from __future__ import annotations

import pytest
import torch

import aioareal.generation.sampling as fs
from aioareal.config import load_config
from aioareal.errors import ConfigError
from aioareal.generation.sampling import (
    SamplingParams,
    fused_sample,
    fused_sampler_enabled,
    inverse_cdf_sample,
    race,
    sample,
)


@pytest.fixture
def eager(monkeypatch):
    """Skip compilation: `fused_sample` runs `race` as written."""
    monkeypatch.setattr(fs, "_race_fn", lambda greedy: race)


def _logits(n: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return (3 * torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed))).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(), SamplingParams(greedy=True),
                                    SamplingParams(temperature=0.7, top_p=0.8)])
def test_same_tokens_and_logprobs_as_sample_for_the_same_generator_state(dtype, params, eager):
    logits = _logits(64, 300, dtype)
    tok, lp = fused_sample(logits, params, torch.Generator().manual_seed(5))
    ref_tok, ref_lp = sample(logits, params, torch.Generator().manual_seed(5))
    assert tok.dtype == torch.int64 and lp.dtype == torch.float32
    assert torch.equal(tok, ref_tok)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)


def test_tokens_follow_the_temperature_scaled_softmax(eager):
    """Chi-square over 40,000 draws from 6 words: p = 0.001 at 5 degrees of freedom is 20.5."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).to(torch.bfloat16)
    draws = 40_000
    tok, lp = fused_sample(logits.expand(draws, -1), SamplingParams(temperature=0.8),
                           torch.Generator().manual_seed(11))
    probs = torch.softmax(logits.float() / 0.8, dim=-1)[0]
    observed = torch.bincount(tok, minlength=6).double()
    expected = probs.double() * draws
    assert ((observed - expected) ** 2 / expected).sum() < 20.5
    torch.testing.assert_close(lp, probs.log()[tok])  # each token's log-prob under the full distribution


def test_the_seed_reproduces_the_draw_and_another_changes_it(eager):
    logits = _logits(32, 50, torch.float32)
    a = fused_sample(logits, SamplingParams(), torch.Generator().manual_seed(1))[0]
    assert torch.equal(a, fused_sample(logits, SamplingParams(), torch.Generator().manual_seed(1))[0])
    assert not torch.equal(a, fused_sample(logits, SamplingParams(), torch.Generator().manual_seed(2))[0])


def test_compiled_on_the_cpu_it_samples_what_the_eager_race_samples():
    """Inductor on the CPU (slow to compile: one small case, both modes)."""
    torch._dynamo.reset()
    fs._compiled.clear()
    logits = _logits(16, 40, torch.bfloat16)
    for params in (SamplingParams(temperature=0.7), SamplingParams(greedy=True)):
        tok, lp = fused_sample(logits, params, torch.Generator().manual_seed(3))
        ref_tok, ref_lp = sample(logits, params, torch.Generator().manual_seed(3))
        assert torch.equal(tok, ref_tok)
        torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    fs._compiled.clear()


def test_the_config_switch():
    assert not fused_sampler_enabled("auto", torch.device("cpu"))
    assert fused_sampler_enabled(True, torch.device("cpu")) and not fused_sampler_enabled(False, torch.device("cuda"))
    assert load_config(overrides=["generation.fused_sampler=true"]).generation.fused_sampler is True
    assert load_config().generation.fused_sampler == "auto"
    with pytest.raises(ConfigError, match="generation.fused_sampler"):
        load_config(overrides=["generation.fused_sampler=sometimes"])


def test_the_engine_samples_with_the_fused_sampler_when_asked():
    from aioareal.models import random_model
    from aioareal.run.build import build_engine

    config = load_config(overrides=["generation.fused_sampler=true"])
    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=0)
    assert build_engine(config, model, [1], max_len=32).sample is fused_sample
    assert build_engine(load_config(), model, [1], max_len=32).sample is inverse_cdf_sample  # the CPU's default


@pytest.mark.gpu
def test_on_cuda_compiled_greedy_equals_sample_and_draws_follow_the_softmax():
    logits = _logits(64, 151_936, torch.bfloat16).cuda()
    gen = torch.Generator("cuda").manual_seed(0)
    tok, lp = fused_sample(logits, SamplingParams(greedy=True), gen)
    ref_tok, ref_lp = sample(logits, SamplingParams(greedy=True), gen)
    assert torch.equal(tok, ref_tok)
    torch.testing.assert_close(lp, ref_lp, atol=1e-4, rtol=1e-4)
    small = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]], device="cuda").expand(100_000, -1)
    tok, _ = fused_sample(small, SamplingParams(temperature=0.8), gen)
    probs = torch.softmax(small[0].float() / 0.8, dim=-1).double().cpu()
    observed = torch.bincount(tok.cpu(), minlength=6).double()
    assert ((observed - probs * 100_000) ** 2 / (probs * 100_000)).sum() < 20.5
