"""The engine's linear layers with weights packed for oneDNN (generation/forward.py): the same
outputs as F.linear, packed once per version, dropped when a version is adopted or the engine goes
idle, and off where it does not apply."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.generation.forward import PackedLinears, packing_pays
from aioareal.group import Group
from aioareal.models import random_model

BF16 = torch.bfloat16
needs_onednn = pytest.mark.skipif(not packing_pays(torch.zeros(1, dtype=BF16), False), reason="no oneDNN packing here")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 64, 130])
def test_packed_equals_f_linear_to_the_bit(rows):
    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 40, generator=gen).to(BF16), torch.randn(96, generator=gen).to(BF16)
    x = torch.randn(rows, 3, 40, generator=gen).to(BF16)
    linear = PackedLinears(True)
    assert torch.equal(linear(x, w, b), torch.nn.functional.linear(x, w, b))
    assert torch.equal(linear(x, w), torch.nn.functional.linear(x, w))


@needs_onednn
def test_a_weight_is_packed_once_until_dropped():
    w = torch.randn(32, 16).to(BF16)
    x = torch.randn(4, 16).to(BF16)
    linear = PackedLinears(True)
    linear(x, w)
    first = linear._packed[id(w)]
    linear(x, w)
    assert linear._packed[id(w)] is first  # reused, not packed again
    w.copy_(torch.randn(32, 16).to(BF16))  # a new version's weights, written in place
    linear.drop()
    assert torch.equal(linear(x, w), torch.nn.functional.linear(x, w))  # packed from the new values


def test_off_it_is_f_linear_and_a_module_that_is_not_a_plain_linear_runs_its_own_forward():
    x = torch.randn(4, 16)
    w = torch.randn(8, 16)
    assert torch.equal(PackedLinears(False)(x, w), torch.nn.functional.linear(x, w))

    class Scaled(nn.Linear):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(inp)

    scaled = Scaled(16, 8)
    assert torch.equal(PackedLinears(True).module(scaled, x), scaled(x))


def test_packing_applies_to_bf16_cpu_weights_of_an_eager_engine_only():
    assert not packing_pays(torch.zeros(1), False)  # fp32
    assert not packing_pays(torch.zeros(1, dtype=BF16), True)  # a compiled decode step traces F.linear


@needs_onednn
def test_the_engine_packs_in_bf16_and_drops_its_packs_on_adopt_and_when_idle():
    model = random_model("tiny", BF16, torch.device("cpu"), seed=0)
    engine = Engine(model, [1], EngineOptions(num_slots=4, max_len=24, params=SamplingParams(max_new_tokens=6), seed=0))
    assert engine.fwd.linear.enabled
    engine.submit(Group(0, [3, 4, 5], 2, forced_lengths=[6, 6]))
    engine.step()
    assert engine.fwd.linear._packed  # decoding packed the weights
    engine.adopt(1)
    assert not engine.fwd.linear._packed
    while engine.busy:
        engine.step()
    engine.idle()
    assert not engine.fwd.linear._packed


@needs_onednn
def test_an_engine_with_packed_weights_samples_what_one_without_does(monkeypatch):
    def run(enabled: bool) -> list[list[int]]:
        model = random_model("tiny", BF16, torch.device("cpu"), seed=0)
        engine = Engine(model, [1], EngineOptions(8, 32, SamplingParams(max_new_tokens=12), seed=3))
        engine.fwd.linear.enabled = enabled
        for gid in range(3):
            engine.submit(Group(gid, [5 + gid, 6, 7, 8], 2))
        done = []
        while engine.busy:
            done += engine.step()
        return [s.tokens + [round(x, 6) for x in s.completion.logprobs] for g in sorted(done, key=lambda g: g.group_id)
                for s in g.samples]

    assert run(True) == run(False)
