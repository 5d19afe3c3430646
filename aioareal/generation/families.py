"""Which Hugging Face model families the engine implements exactly, and why it refuses the rest.

The engine reimplements each family's decoder over the model's own modules, so it is right only for
families whose differences it knows, each proven against the model's forward in
tests/generation/test_families.py. Anything else gets a one-line reason (backends.py).
"""
from __future__ import annotations

from typing import Any

ENGINE_FAMILIES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2",
    "granite", "smollm3",
})
ROPE_TYPES = frozenset({"default", "linear", "dynamic", "yarn", "longrope", "llama3"})
LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})  # frequencies change past a length


def unsupported_reason(hf_config: Any, max_len: int | None = None) -> str | None:
    """None where the engine implements this model exactly (for `max_len` tokens), else a short reason."""
    kind = getattr(hf_config, "model_type", None)
    if kind not in ENGINE_FAMILIES:
        return f"model_type '{kind}' is not implemented by the engine"
    if getattr(hf_config, "use_bidirectional_attention", False):
        return f"model_type '{kind}' with use_bidirectional_attention is not implemented by the engine"
    for params in _rope_parameters(hf_config):
        reason = _rope_reason(hf_config, params, max_len)
        if reason is not None:
            return reason
    return None


def _rope_parameters(config: Any) -> list[dict]:
    """The RoPE parameter sets of `config`: one, or one per layer type (Gemma 3)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(params, dict):
        return []
    if params and all(isinstance(v, dict) for v in params.values()):
        return list(params.values())
    return [params]


def _rope_reason(config: Any, params: dict, max_len: int | None) -> str | None:
    rope = params.get("rope_type", params.get("type", "default")) or "default"
    if rope not in ROPE_TYPES:
        return f"RoPE type '{rope}' is not implemented by the engine"
    if rope in LENGTH_DEPENDENT_ROPE and max_len is not None:
        limit = _original_length(config, params, rope)
        if limit is not None and max_len > limit:
            return (f"RoPE type '{rope}' changes its frequencies past {limit} tokens, and the engine "
                    f"keeps one table for its context of {max_len}")
    return None


def _original_length(config: Any, params: dict, rope: str) -> int | None:
    """Up to which length a length-dependent RoPE keeps its short-sequence frequencies (as transformers)."""
    if rope == "dynamic":
        return getattr(config, "max_position_embeddings", None)
    return params.get("original_max_position_embeddings") or getattr(
        config, "original_max_position_embeddings", None) or getattr(config, "max_position_embeddings", None)


def logit_transform(hf_config: Any) -> tuple[float | None, float | None]:
    """(divisor, soft cap): what the family's ForCausalLM does to lm_head's output, which any code
    calling the head itself must do too (Granite's logits_scaling, Gemma 2 and 3's soft cap)."""
    kind = getattr(hf_config, "model_type", None)
    divisor = getattr(hf_config, "logits_scaling", None) if kind == "granite" else None
    cap = getattr(hf_config, "final_logit_softcapping", None) if kind in ("gemma2", "gemma3_text") else None
    return divisor, cap
