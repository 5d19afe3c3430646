"""The engine's forward pass for the decoder families beyond the plain Llama/Qwen layer.

`FamilyForward` runs forward.py's static cache, prefill and decode, each layer as its `LayerPlan`
says (below); `build_forward` takes the plain fast path where every layer is plain.

Sliding windows are masks over the full cache (keys in (p - w, p], as transformers), one per
distinct window per pass. Every query also attends to itself, so a padded prompt position whose
window holds no real key never gets an empty softmax row (a NaN in the cache).

`LayerPlan`: what each decoder layer of a model computes, read once from its modules and config, so the
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

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from ..models.ops import matmul_attention_pays, short_attention
from .forward import (
    _HAS_GQA,
    FastForward,
    FusedLinear,
    KVCache,
    check_supported,
    fuse,
    logit_transform,
    prefill_positions,
)
from .prefix import PrefixLayout

Ropes = dict[str | None, tuple[torch.Tensor, torch.Tensor]]


def build_forward(model: PreTrainedModel, max_len: int, fuse: bool = True, compiled: bool = False) -> FastForward:
    """The engine's forward pass for `model`: the plain fast path where it applies."""
    check_supported(model.config, max_len)  # before reading layers an unsupported model may not have
    plans = layer_plans(model)
    if plans and is_plain(model, plans):
        return FastForward(model, max_len, fuse=fuse, compiled=compiled)
    return FamilyForward(model, max_len, fuse=fuse, compiled=compiled, plans=plans)


class FamilyForward(FastForward):
    """Prefill and decode for the families `layer_plans` reads (a plan per layer, fixed at construction)."""

    shares_prefix = False  # prefix.py's shared-prefix decode knows neither windows nor scales

    def __init__(self, model: PreTrainedModel, max_len: int, fuse: bool = True, compiled: bool = False,
                 plans: list[LayerPlan] | None = None) -> None:
        check_supported(model.config, max_len)  # before reading layers an unsupported model may not have
        self.plans = plans if plans is not None else layer_plans(model)
        super().__init__(model, max_len, fuse=fuse, compiled=compiled)
        config = model.config
        self.windows = sorted({p.window for p in self.plans}, key=lambda w: -1 if w is None else w)
        self.embed_multiplier = getattr(model.model, "embedding_multiplier", None)  # Granite
        self.logits_divisor, self.final_softcap = logit_transform(config)

    def _fuse_projections(self, enabled: bool) -> None:
        """q/k/v and gate/up fused as in forward.py where they are separate modules; a projection
        the checkpoint already fuses (Phi-3) runs as it is and is split."""
        self.qkv: list[FusedLinear | None] = [None] * len(self.plans)
        self.gate_up: list[FusedLinear | None] = [None] * len(self.plans)
        if not enabled:
            return
        for i, plan in enumerate(self.plans):
            self.qkv[i] = fuse(list(plan.qkv)) if len(plan.qkv) > 1 else None
            self.gate_up[i] = fuse(list(plan.gate_up)) if len(plan.gate_up) > 1 else None

    # -- building blocks -------------------------------------------------------------------------
    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.model.model.embed_tokens(tokens)  # Gemma's embedding module scales by sqrt(hidden) itself
        return h if self.embed_multiplier is None else h * self.embed_multiplier

    def _split(self, fused: FusedLinear | None, x: torch.Tensor, modules: tuple, sizes: list[int]):
        if fused is not None:
            return self.linear(x, fused.weight, fused.bias).split(fused.sizes, dim=-1)
        if len(modules) == 1:
            return self.linear.module(modules[0], x).split(sizes, dim=-1)
        return tuple(self.linear.module(m, x) for m in modules)

    def _plan_qkv(self, i: int, plan: LayerPlan, h: torch.Tensor, ropes: Ropes):
        x = h if plan.norms[0] is None else plan.norms[0](h)
        n, t, _ = x.shape
        q, k, v = self._split(self.qkv[i], x, plan.qkv, plan.qkv_sizes)
        if plan.q_norm is not None and not plan.qk_norm_per_head:  # OLMo 2: over all heads at once
            q, k = plan.q_norm(q), plan.k_norm(k)
        q = q.reshape(n, t, self.heads, self.head_dim)
        k = k.reshape(n, t, self.kv_heads, self.head_dim)
        v = v.reshape(n, t, self.kv_heads, self.head_dim)
        if plan.q_norm is not None and plan.qk_norm_per_head:
            q, k = plan.q_norm(q), plan.k_norm(k)
        if plan.rope:
            rope = ropes[plan.rope_table]
            q, k = _partial_rope(q, rope), _partial_rope(k, rope)
        return q, k, v

    def _plan_attend(self, plan: LayerPlan, q, k, v, mask) -> torch.Tensor:
        """q (n, T, H, D), k/v (n, S, Hkv, D), mask (n, 1, T, S) bool -> (n, T, H*D)."""
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if matmul_attention_pays(q):  # SDPA's CPU kernel is slow in 16-bit; the soft cap applies too
            return short_attention(q, k, v, mask, plan.scale, plan.softcap).flatten(2)
        if plan.softcap is None:
            gqa = {"enable_gqa": True} if _HAS_GQA and self.kv_heads != self.heads else {}
            if self.kv_heads != self.heads and not _HAS_GQA:
                k, v = _repeat_kv(k, v, self.heads // self.kv_heads)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=plan.scale, **gqa)
        else:  # Gemma 2: tanh soft cap on the scores, which SDPA cannot apply
            k, v = _repeat_kv(k, v, self.heads // self.kv_heads)
            scores = torch.matmul(q, k.transpose(-1, -2)) * plan.scale
            scores = torch.tanh(scores / plan.softcap) * plan.softcap
            scores = scores.masked_fill(~mask, float("-inf"))
            out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
        return out.transpose(1, 2).flatten(2)

    def _plan_rest(self, i: int, plan: LayerPlan, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The attention output projected, normed and added; then the MLP block."""
        _, post_attn, pre_mlp, post_mlp = plan.norms
        a = self.linear.module(plan.o_proj, attn)
        a = a if post_attn is None else post_attn(a)
        h = h + a * plan.residual
        x = h if pre_mlp is None else pre_mlp(h)
        gate, up = self._split(self.gate_up[i], x, plan.gate_up, plan.gate_up_sizes)
        m = self.linear.module(plan.down, plan.act(gate) * up)
        m = m if post_mlp is None else post_mlp(m)
        return h + m * plan.residual

    def _ropes(self, pos: torch.Tensor) -> Ropes:
        """Each table's rows at positions pos (n, T) -> (n, T, 1, rotary_dim), once per pass."""
        return {key: (cos[pos][:, :, None, :], sin[pos][:, :, None, :]) for key, (cos, sin) in self.tables.items()}

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.linear.module(self.model.lm_head, self.model.model.norm(hidden))
        if self.logits_divisor is not None:
            logits = logits / self.logits_divisor
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    # -- passes ----------------------------------------------------------------------------------
    def prefill(self, cache: KVCache, tokens: torch.Tensor, lengths: torch.Tensor,
                slots: torch.Tensor, copies: int = 1, start: int = 0) -> torch.Tensor:
        """As FastForward.prefill, each layer by its plan."""
        n, t = tokens.shape
        pos, distance, key_valid = prefill_positions(t, start, lengths)
        eye = distance == 0
        masks = {w: ((_in_window(distance, w)[None] & key_valid[:, None, :]) | eye)[:, None] for w in self.windows}
        write_slots = slots.view(n, copies, 1).expand(n, copies, t)
        write_pos = pos[:, None, :].expand(n, copies, t)
        first = slots.view(n, copies)[:, 0]
        h, ropes = self._embed(tokens), self._ropes(pos)
        for i, plan in enumerate(self.plans):
            q, k, v = self._plan_qkv(i, plan, h, ropes)
            cache.k[i][write_slots, write_pos] = k[:, None].expand(n, copies, *k.shape[1:])
            cache.v[i][write_slots, write_pos] = v[:, None].expand(n, copies, *v.shape[1:])
            if start:
                k, v = cache.k[i][first, :start + t], cache.v[i][first, :start + t]
            h = self._plan_rest(i, plan, h, self._plan_attend(plan, q, k, v, masks[plan.window]))
        last = (lengths - 1).clamp(min=0)
        return h[torch.arange(n, device=h.device), last]

    def decode(self, cache: KVCache, tokens: torch.Tensor, pos: torch.Tensor, span: int,
               slots: torch.Tensor | None = None, prefix: PrefixLayout | None = None) -> torch.Tensor:
        """As FastForward.decode (without the shared-prefix layout), each layer by its plan."""
        n = tokens.shape[0]
        rows = torch.arange(n, device=tokens.device) if slots is None else slots
        keys = torch.arange(span, device=tokens.device)[None, :]
        causal = keys <= pos[:, None]
        masks = {w: (causal if w is None else causal & (keys > pos[:, None] - w))[:, None, None, :]
                 for w in self.windows}
        h, ropes = self._embed(tokens[:, None]), self._ropes(pos[:, None])
        for i, plan in enumerate(self.plans):
            q, k, v = self._plan_qkv(i, plan, h, ropes)
            cache.k[i][rows, pos] = k[:, 0]
            cache.v[i][rows, pos] = v[:, 0]
            keys_i = cache.k[i][:n, :span] if slots is None else cache.k[i][slots, :span]
            values_i = cache.v[i][:n, :span] if slots is None else cache.v[i][slots, :span]
            h = self._plan_rest(i, plan, h, self._plan_attend(plan, q, keys_i, values_i, masks[plan.window]))
        return h[:, 0]


def _partial_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """RoPE on the first rotary_dim features of x (n, T, heads, head_dim); the rest pass (Phi-3's
    partial_rotary_factor), as transformers' apply_rotary_pos_emb."""
    cos, sin = rope
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return FastForward._rope(x, rope)
    return torch.cat([FastForward._rope(x[..., :dim], rope), x[..., dim:]], dim=-1)


def _in_window(distance: torch.Tensor, window: int | None) -> torch.Tensor:
    """Which keys a query sees, from query minus key positions: causal, and within the window."""
    seen = distance >= 0
    return seen if window is None else seen & (distance < window)


def _repeat_kv(k: torch.Tensor, v: torch.Tensor, rep: int) -> tuple[torch.Tensor, torch.Tensor]:
    if rep == 1:
        return k, v
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


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
