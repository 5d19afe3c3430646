"""The engine's attention on the CPU in 16-bit: two batched matmuls and a softmax instead of SDPA
(models/ops.py `matmul_attention_pays`), in prefill and decode, for the plain layer and the family
layers (Gemma 2's soft cap and sliding window included). Held to the same fp32 forward as SDPA's
path: the matmul path's log-prob error is within a bf16 bound and no larger than SDPA's own."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import generate, random_groups, reference_logprobs
from test_families import engine_for, family_model

from aioareal.generation import family_forward, forward


def _errors(model16: torch.nn.Module, reference: torch.nn.Module, monkeypatch, sdpa_allowed: bool) -> torch.Tensor:
    """|engine log-prob - fp32 forward| over every sampled token, SDPA forbidden to the engine
    unless `sdpa_allowed` (then the matmul path is switched off instead)."""
    with monkeypatch.context() as patch:
        if sdpa_allowed:
            for module in (forward, family_forward):
                patch.setattr(module, "matmul_attention_pays", lambda q: False)
        else:
            def refuse(*args, **kwargs):
                raise AssertionError("SDPA called on the 16-bit CPU path")
            patch.setattr(F, "scaled_dot_product_attention", refuse)
        results = generate(engine_for(copy.deepcopy(model16)), random_groups([2, 3, 1], seed=2))
    errors = [(torch.tensor(c.logprobs) - reference_logprobs(reference, g.prompt_ids, c.tokens)).abs()
              for g in results for c in g.completions]
    return torch.cat(errors)


@pytest.mark.parametrize("family", ["llama", "gemma2", "mistral-window"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_cpu_attention_takes_the_matmuls_and_stays_within_rounding(family, dtype, monkeypatch):
    model16 = family_model(family).to(dtype)
    reference = copy.deepcopy(model16).float()  # the same (rounded) weights, computed in fp32
    matmuls = _errors(model16, reference, monkeypatch, sdpa_allowed=False)
    sdpa = _errors(model16, reference, monkeypatch, sdpa_allowed=True)
    assert matmuls.numel() > 20
    bound = 0.05 if dtype == torch.bfloat16 else 0.01
    assert matmuls.mean() < bound and matmuls.max() < 10 * bound, (matmuls.mean(), matmuls.max())
    assert matmuls.mean() < 2 * sdpa.mean() + 1e-3, (matmuls.mean(), sdpa.mean())


def test_fp32_and_other_devices_keep_sdpa():
    assert forward.matmul_attention_pays(torch.zeros(1, dtype=torch.bfloat16))
    assert not forward.matmul_attention_pays(torch.zeros(1))
    assert not forward.matmul_attention_pays(torch.zeros(1, dtype=torch.bfloat16, device="meta"))
