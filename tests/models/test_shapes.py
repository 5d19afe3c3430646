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
