"""The two halves of a causal LM the trainer calls directly: the decoder stack (hidden states) and
the LM head (trainer/logprobs.py runs the head in chunks, never the causal LM's own forward).

Llama-shaped models (and models/lora.py's `AdaptersOff`) name them `model` and `lm_head`; other
families their own way (GPT-NeoX: `gpt_neox` and `embed_out`), which transformers exposes as
`base_model` and `get_output_embeddings()`, so a model on the HF fallback backend
(generation/hf_backend.py) trains through the same code."""
from __future__ import annotations

from typing import Any

import torch


def decoder(model: Any) -> Any:
    """What maps input ids to the last hidden states (a module, or AdaptersOff's `model` method)."""
    return model.model if hasattr(model, "model") else model.base_model


def head(model: Any) -> torch.nn.Module:
    return model.lm_head if hasattr(model, "lm_head") else model.get_output_embeddings()
