"""What each decoder layer of a model computes, read once from its modules and config, so the
decode loop makes no per-family decision per step. Where the families differ from the plain
Llama/Qwen layer (forward.py):
- norms: before attention and MLP (Llama), also after each (Gemma 2/3), or only after (OLMo 2);
- projections: separate or fused in the checkpoint (Phi-3's qkv_proj and gate_up_proj);
- q/k norms: per head (Qwen3, Gemma 3) or over all heads (OLMo 2);
- RoPE or none (SmolLM3's NoPE layers), and which table (Gemma 3's local and global layers);
- a sliding window (Mistral, Qwen2 with use_sliding_window, Gemma 2/3 local layers, Phi-3);
- the attention scale (Gemma's query_pre_attn_scalar, Granite's attention_multiplier) and soft cap
  (Gemma 2), the MLP's activation (GELU-tanh for Gemma) and Granite's residual multiplier.
Norms and activations are the model's own modules, so they compute what the model computes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn
from transformers import PreTrainedModel

PLAIN_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# (before attention, after attention, before MLP, after MLP): the layer's attribute names.
SANDWICH_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm")
NORMS = {
    "gemma2": SANDWICH_NORMS,
    "gemma3_text": SANDWICH_NORMS,
    "olmo2": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}
LLAMA_NORMS = ("input_layernorm", None, "post_attention_layernorm", None)
WINDOW_FROM_CONFIG = frozenset({"mistral", "phi3"})  # their attention modules keep no sliding_window
SOFTCAP_ATTENTION = frozenset({"gemma2"})  # Gemma 3 keeps the setting but its attention ignores it


@dataclass
class LayerPlan:
    norms: tuple[nn.Module | None, ...]  # before attention, after attention, before MLP, after MLP
    qkv: tuple[nn.Module, ...]  # q, k, v, or one fused qkv_proj
    qkv_sizes: list[int]
    gate_up: tuple[nn.Module, ...]  # gate, up, or one fused gate_up_proj
    gate_up_sizes: list[int]
    o_proj: nn.Module
    down: nn.Module
    act: Callable
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    qk_norm_per_head: bool
    rope: bool
    rope_table: str | None  # key into rotary.rotary_tables
    window: int | None
    scale: float
    softcap: float | None
    residual: float


def layer_plans(model: PreTrainedModel) -> list[LayerPlan]:
    config = model.config
    kind = config.model_type
    per_type_tables = bool(getattr(model.model.rotary_emb, "layer_types", None))
    return [_plan(config, kind, i, layer, per_type_tables) for i, layer in enumerate(model.model.layers)]


def _plan(config, kind: str, i: int, layer: nn.Module, per_type_tables: bool) -> LayerPlan:
    attn, mlp = layer.self_attn, layer.mlp
    head_dim = getattr(attn, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q_size, kv_size = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    inner = mlp.down_proj.in_features
    names = NORMS.get(kind, LLAMA_NORMS)
    if hasattr(attn, "sliding_window"):
        window = attn.sliding_window
    else:
        window = getattr(config, "sliding_window", None) if kind in WINDOW_FROM_CONFIG else None
    return LayerPlan(
        norms=tuple(getattr(layer, name) if name else None for name in names),
        qkv=(attn.qkv_proj,) if hasattr(attn, "qkv_proj") else (attn.q_proj, attn.k_proj, attn.v_proj),
        qkv_sizes=[q_size, kv_size, kv_size],
        gate_up=(mlp.gate_up_proj,) if hasattr(mlp, "gate_up_proj") else (mlp.gate_proj, mlp.up_proj),
        gate_up_sizes=[inner, inner],
        o_proj=attn.o_proj, down=mlp.down_proj,
        act=getattr(mlp, "act_fn", None) or mlp.activation_fn,
        q_norm=getattr(attn, "q_norm", None), k_norm=getattr(attn, "k_norm", None),
        qk_norm_per_head=kind != "olmo2",
        rope=bool(getattr(attn, "use_rope", True)),
        rope_table=config.layer_types[i] if per_type_tables else None,
        window=window,
        scale=float(attn.scaling),
        softcap=getattr(config, "attn_logit_softcapping", None) if kind in SOFTCAP_ATTENTION else None,
        residual=float(getattr(layer, "residual_multiplier", 1.0)),
    )


def is_plain(model: PreTrainedModel, plans: list[LayerPlan]) -> bool:
    """Whether every layer is the plain Llama/Qwen layer that forward.py's fast path computes."""
    config = model.config
    return (config.model_type in PLAIN_FAMILIES and getattr(config, "hidden_act", "silu") == "silu"
            and not getattr(model.model.rotary_emb, "layer_types", None)
            and all(p.window is None and p.rope and len(p.qkv) == 3 and len(p.gate_up) == 2
                    and abs(p.scale - (p.qkv_sizes[0] // config.num_attention_heads) ** -0.5) < 1e-12
                    for p in plans))


def sliding_windows(model: nn.Module) -> set[int]:
    """The sliding windows any layer of `model` (an HF model, or one wrapped by peft) attends within."""
    config = model.config
    found = {m.sliding_window for m in model.modules() if isinstance(getattr(m, "sliding_window", None), int)}
    if config.model_type in WINDOW_FROM_CONFIG and getattr(config, "sliding_window", None):
        found.add(int(config.sliding_window))
    return found
