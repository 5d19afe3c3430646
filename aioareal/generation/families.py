"""Which model families the engine's own decoder implements exactly (forward.py).

`unsupported_reason(config)` is None where the engine computes what the model's own forward does;
otherwise one line saying why not. `generation.backend=auto` runs the engine where it is None and
the HF fallback (hf_backend.py) elsewhere; the start-up check (backends.py) then compares the
chosen backend with the model's own forward on its real weights.
"""
from __future__ import annotations

from typing import Any

from ..errors import UserError

# Llama-shaped decoders (q/k/v/o, SiLU gate/up, RMSNorm, RoPE) whose forward the engine reproduces.
ENGINE_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def unsupported_reason(hf_config: Any) -> str | None:
    """None when the engine implements `hf_config`'s architecture exactly, else why not."""
    model_type = getattr(hf_config, "model_type", "?")
    if model_type not in ENGINE_FAMILIES:
        return f"the engine does not implement model_type '{model_type}'"
    if getattr(hf_config, "sliding_window", None) and model_type == "mistral":
        return "sliding-window attention is not implemented by the engine"
    from .forward import FastForward  # the engine's own guard (RoPE type, Qwen2's sliding window)

    try:
        FastForward._check_supported(hf_config)
    except UserError as e:
        return str(e).removeprefix("model: ")
    return None
