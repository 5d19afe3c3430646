"""Named shapes with random weights (aioareal/models/shapes.py): each has the dimensions of the model it
is named after, so what `bench profile` measures on it is what that model costs."""
from __future__ import annotations

import torch
from transformers import Qwen2ForCausalLM

from aioareal.models.shapes import SHAPES, shape_config


def parameters(name: str) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in Qwen2ForCausalLM(shape_config(name, 100, 0, 1)).parameters())


def test_the_smollm2_shape_is_smollm2_plus_the_qwen2_biases():
    # docs/architecture.md#reference-facts: SmolLM2-135M has 134,515,008 parameters (tied embeddings);
    # the Qwen2 layout adds q/k/v biases: (576 + 192 + 192) per layer over 30 layers.
    assert parameters("smollm2-135m") == 134_515_008 + 30 * (576 + 2 * 3 * 64)


def test_the_qwen_shape_has_qwens_parameter_count():
    assert "qwen2.5-0.5b" in SHAPES and parameters("qwen2.5-0.5b") == 494_032_768



def test_a_bench_draws_random_weights_on_its_device_and_a_run_on_the_cpu(monkeypatch):
    # bench/harness.py builds on the bench's device (a GPU then initializes Qwen2.5-0.5B in
    # milliseconds, not ~35 s on the host); a run's random model is drawn on the CPU wherever it goes.
    from aioareal.lab.bench.harness import build_model
    from aioareal.models import load_policy, random_model

    built_on = []
    real = load_policy.AutoModelForCausalLM.from_config

    def spy(*args, **kwargs):
        built_on.append(torch.get_default_device().type)
        return real(*args, **kwargs)

    monkeypatch.setattr(load_policy.AutoModelForCausalLM, "from_config", spy)
    on_meta = build_model("random:tiny", torch.float32, torch.device("meta"))
    assert built_on == ["meta"] and {p.device.type for p in on_meta.parameters()} == {"meta"}
    random_model("tiny", torch.float32, torch.device("meta"))
    assert built_on == ["meta", "cpu"]
    # On the CPU the two agree: one seed, one set of weights.
    run_model = random_model("tiny", torch.float32, torch.device("cpu"), seed=5)
    bench_model = build_model("random:tiny", torch.float32, torch.device("cpu"), seed=5)
    for a, b in zip(run_model.state_dict().values(), bench_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    other_seed = random_model("tiny", torch.float32, torch.device("cpu"), seed=6)
    assert not torch.equal(other_seed.lm_head.weight, run_model.lm_head.weight)
