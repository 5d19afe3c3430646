"""A static-KV-cache forward pass over a Hugging Face Qwen2/Llama-family model's own modules.

No weights are copied: the engine calls the model's Linear and norm modules (with `fuse`, a fused
weight the HF parameters are re-pointed into, `fuse` below), so a weight sync's in-place `param.copy_`
is seen by the next step, CUDA graphs included. The cache is (slots, max_len, kv_heads, head_dim)
per layer; prefill writes whole prompts, decode one token per slot over a length bucket.

This is the plain Llama/Qwen layer (pre-norm RMSNorm, SiLU MLP, RoPE of any variant in every layer,
no sliding window; Qwen3's q/k norms). Other families run in family_forward.py (which: `unsupported_reason`).

`fuse`, fused projections for the engine: q|k|v as one matmul per layer and gate|up as another, the same
bytes read in two launches instead of five.

The fused weight is the model's storage, not a copy: each HF Linear's parameter is re-pointed
(`param.data = fused[rows]`) at its rows, so the weight sync's in-place `param.copy_` lands in it and
every later pass (eager, compiled, or a CUDA graph holding its pointer) sees the new weights.

`fusable` refuses what is not exactly `nn.Linear` (LoRA wrappers, quantised layers), sharded
parameters (FSDP owns their storage), and mixed dtypes, devices or biases. Never fuse a model that
trains (evaluation passes `fuse=False`): `save_pretrained` refuses shared storage, and anything
that later rebinds a parameter (`fully_shard`, `.to()`, `load_state_dict(assign=True)`) silently
detaches it from the tensor the engine reads.

`unsupported_reason`: which Hugging Face model families the engine implements exactly, and why it refuses the rest.

The engine reimplements each family's decoder over the model's own modules, so it is right only for
families whose differences it knows, each proven against the model's forward in
tests/generation/test_families.py. Anything else gets a one-line reason (backends.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from ..errors import UserError
from ..models.ops import matmul_attention_pays, short_attention
from .prefix import PrefixLayout, shared_prefix_attention

_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
_HAS_RMS_NORM = hasattr(F, "rms_norm")


def check_supported(config, max_len: int) -> None:
    """Refuse, in one line, a model the engine does not implement exactly (`unsupported_reason`)."""
    reason = unsupported_reason(config, max_len)
    if reason is not None:
        raise UserError(f"model: {reason}")


def kv_bytes_per_token(model: PreTrainedModel, dtype: torch.dtype) -> int:
    """K and V of one token in every layer: layers * 2 * kv_heads * head_dim * dtype bytes."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return c.num_hidden_layers * 2 * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def prefill_positions(t: int, start: int, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prefill of right-padded rows of `t` tokens from position `start` (the keys before it a shared
    prefix already cached): the rows' positions (n, T), query minus key position (T, start + T), and
    which keys each row holds (n, start + T): the prefix's and its own up to its length."""
    device = lengths.device
    idx = torch.arange(t, device=device)
    keys = torch.arange(start + t, device=device)
    pos = (idx + start).expand(lengths.shape[0], t)
    distance = (idx + start)[:, None] - keys[None, :]
    key_valid = (keys[None, :] < start) | (keys[None, :] - start < lengths[:, None])
    return pos, distance, key_valid


class KVCache:
    """Per-layer key and value tensors, (slots, max_len, kv_heads, head_dim) each."""

    def __init__(self, layers: int, slots: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (slots, max_len, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.slots, self.max_len = slots, max_len

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class FastForward:
    """Prefill and decode over a static KV cache, reusing the HF model's parameters in place."""

    shares_prefix = True  # decode can read each group's prompt keys once (prefix.py)

    def __init__(self, model: PreTrainedModel, max_len: int, fuse: bool = True, compiled: bool = False) -> None:
        check_supported(model.config, max_len)
        self.model = model
        base = model.model
        self.layers = list(base.layers)
        attn = self.layers[0].self_attn
        config = model.config
        self.head_dim = getattr(attn, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.eps = getattr(config, "rms_norm_eps", 1e-6)
        self.tables = rotary_tables(model, max_len)
        self.cos, self.sin = next(iter(self.tables.values()))  # (max_len, head_dim) each
        self.max_len = max_len
        self._fuse_projections(fuse)
        self.linear = PackedLinears(packing_pays(model.get_input_embeddings().weight, compiled))

    def _fuse_projections(self, enabled: bool) -> None:
        """Per layer, the fused (q|k|v) and (gate|up) projections, or None where a layer's modules
        run one by one (fusion off or unsafe for that layer: `fusable`, below)."""
        self.qkv: list[FusedLinear | None] = [None] * len(self.layers)
        self.gate_up: list[FusedLinear | None] = [None] * len(self.layers)
        if not enabled:
            return
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            self.qkv[i] = fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            self.gate_up[i] = fuse([mlp.gate_proj, mlp.up_proj])

    @property
    def fused(self) -> bool:
        """Whether every layer runs both fused projections."""
        return all(f is not None for f in self.qkv + self.gate_up)

    def new_cache(self, slots: int, dtype: torch.dtype | None = None) -> KVCache:
        weight = self.model.get_input_embeddings().weight
        return KVCache(len(self.layers), slots, self.max_len, self.kv_heads, self.head_dim,
                       dtype or weight.dtype, weight.device)

    # -- building blocks -------------------------------------------------------------------------
    def _norm(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if _HAS_RMS_NORM:
            # One fused kernel where HF's launches six. HF rounds once more before scaling, so in
            # bf16 some outputs differ by an ulp: small beside the bf16 trainer's own rounding.
            return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
        return module.weight * xf.to(x.dtype)

    def _rope_tables(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin at positions pos (n, T) -> (n, T, 1, head_dim) each, gathered once per pass."""
        return self.cos[pos][:, :, None, :], self.sin[pos][:, :, None, :]

    @staticmethod
    def _rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x (n, T, heads, head_dim)."""
        cos, sin = rope
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _qkv(self, i: int, layer, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        attn = layer.self_attn
        n, t, _ = h.shape
        fused = self.qkv[i]
        q, k, v = self._projections(fused, h, (attn.q_proj, attn.k_proj, attn.v_proj))
        # Column slices of the fused output: `view` only splits the last dim, so it needs no copy.
        q = q.view(n, t, self.heads, self.head_dim)
        k = k.view(n, t, self.kv_heads, self.head_dim)
        v = v.view(n, t, self.kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = self._norm(attn.q_norm, q), self._norm(attn.k_norm, k)
        return self._rope(q, rope), self._rope(k, rope), v

    def _attend(self, q, k, v, mask) -> torch.Tensor:
        """q (n, T, H, D), k/v (n, S, Hkv, D), mask (n, 1, T, S) bool -> (n, T, H*D)."""
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if matmul_attention_pays(q):
            return short_attention(q, k, v, mask, None).flatten(2)
        if self.kv_heads == self.heads:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif _HAS_GQA:  # reads each KV head once instead of materialising H/Hkv copies
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        else:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).flatten(2)

    def _mlp(self, i: int, layer, h: torch.Tensor) -> torch.Tensor:
        mlp = layer.mlp
        fused = self.gate_up[i]
        gate, up = self._projections(fused, h, (mlp.gate_proj, mlp.up_proj))
        return self.linear.module(mlp.down_proj, F.silu(gate) * up)

    def _projections(self, fused: FusedLinear | None, h: torch.Tensor,
                     linears: tuple[torch.nn.Module, ...]) -> tuple[torch.Tensor, ...]:
        """The outputs of `linears` over the same input: one fused matmul, or one each."""
        if fused is None:
            return tuple(self.linear.module(m, h) for m in linears)
        return self.linear(h, fused.weight, fused.bias).split(fused.sizes, dim=-1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear.module(self.model.lm_head, self._norm(self.model.model.norm, hidden))

    # -- passes ----------------------------------------------------------------------------------
    def prefill(self, cache: KVCache, tokens: torch.Tensor, lengths: torch.Tensor,
                slots: torch.Tensor, copies: int = 1, start: int = 0) -> torch.Tensor:
        """Run right-padded prompts tokens (n, T) from position `start`; write their K/V into `copies`
        consecutive rows of `slots` (n * copies,) each (one forward serves a whole group); return the
        hidden states at each prompt's last token (n, hidden). With `start` > 0 the slots already hold
        a shared prompt prefix's K/V at [0, start) and the tokens continue it."""
        n, t = tokens.shape
        pos, distance, key_valid = prefill_positions(t, start, lengths)
        mask = ((distance >= 0)[None] & key_valid[:, None, :])[:, None]  # (n, 1, T, start + T)
        write_slots = slots.view(n, copies, 1).expand(n, copies, t)
        write_pos = pos[:, None, :].expand(n, copies, t)
        first = slots.view(n, copies)[:, 0]  # where a row's whole context is read back from, with a prefix
        h = self.model.model.embed_tokens(tokens)
        rope = self._rope_tables(pos)
        for i, layer in enumerate(self.layers):
            x = self._norm(layer.input_layernorm, h)
            q, k, v = self._qkv(i, layer, x, rope)
            cache.k[i][write_slots, write_pos] = k[:, None].expand(n, copies, *k.shape[1:])
            cache.v[i][write_slots, write_pos] = v[:, None].expand(n, copies, *v.shape[1:])
            if start:
                k, v = cache.k[i][first, :start + t], cache.v[i][first, :start + t]
            h = h + self.linear.module(layer.self_attn.o_proj, self._attend(q, k, v, mask))
            h = h + self._mlp(i, layer, self._norm(layer.post_attention_layernorm, h))
        last = (lengths - 1).clamp(min=0)
        return h[torch.arange(n, device=h.device), last]

    def decode(self, cache: KVCache, tokens: torch.Tensor, pos: torch.Tensor, span: int,
               slots: torch.Tensor | None = None, prefix: PrefixLayout | None = None) -> torch.Tensor:
        """One token for each of the first n slots, or for the n given `slots`: tokens (n,), pos (n,)
        -> hidden (n, hidden), attending over keys [0, span). With `slots` each layer gathers those
        cache rows (cheap only for short contexts: the CPU path); with `prefix` (its rows are the
        slots) each group's prompt keys are read once (prefix.py)."""
        n = tokens.shape[0]
        if prefix is not None:
            slots = prefix.rows
        rows = torch.arange(n, device=tokens.device) if slots is None else slots
        keys = torch.arange(span, device=tokens.device)
        mask = (keys[None, :] <= pos[:, None])[:, None, None, :]  # (n, 1, 1, span)
        h = self.model.model.embed_tokens(tokens[:, None])
        rope = self._rope_tables(pos[:, None])
        for i, layer in enumerate(self.layers):
            x = self._norm(layer.input_layernorm, h)
            q, k, v = self._qkv(i, layer, x, rope)
            cache.k[i][rows, pos] = k[:, 0]
            cache.v[i][rows, pos] = v[:, 0]
            if prefix is not None:
                attn = shared_prefix_attention(q[:, 0], cache.k[i], cache.v[i], pos, span, prefix)[:, None]
            elif slots is None:
                attn = self._attend(q, cache.k[i][:n, :span], cache.v[i][:n, :span], mask)
            else:
                attn = self._attend(q, cache.k[i][slots, :span], cache.v[i][slots, :span], mask)
            h = h + self.linear.module(layer.self_attn.o_proj, attn)
            h = h + self._mlp(i, layer, self._norm(layer.post_attention_layernorm, h))
        return h[:, 0]


# The rotary tables come from the model's own `rotary_emb`, so every RoPE variant transformers
# implements is the engine's too: asked once for positions [0, max_len), gathered per pass. The
# length-dependent variants (dynamic, longrope) match only while max_len stays within their original
# length; `unsupported_reason` refuses longer contexts.
Tables = tuple[torch.Tensor, torch.Tensor]  # cos, sin: (max_len, rotary_dim) each


@torch.no_grad()
def rotary_tables(model: PreTrainedModel, max_len: int) -> dict[str | None, Tables]:
    """{layer type: (cos, sin)}: keyed None, or per layer type where the rotary module has several."""
    rotary = model.model.rotary_emb
    weight = model.get_input_embeddings().weight
    probe = torch.zeros(1, dtype=weight.dtype, device=weight.device)  # only its dtype and device are read
    positions = torch.arange(max_len, device=weight.device)[None]
    kinds = getattr(rotary, "layer_types", None)
    if not kinds:
        cos, sin = rotary(probe, positions)
        return {None: (cos[0], sin[0])}
    tables = {}
    for kind in kinds:
        cos, sin = rotary(probe, positions, kind)
        tables[kind] = (cos[0], sin[0])
    return tables


# Linear layers with their weights packed once per version for the CPU's matmul units. torch's eager
# bf16 CPU matmul hands oneDNN the weight in its plain layout, which oneDNN reorders into its blocked
# layout on every call: at a decode batch, about the cost of the multiply. `PackedLinears` keeps one
# packed copy per weight (`mkldnn._reorder_linear_weight`) and multiplies with
# `mkldnn._linear_pointwise`, bit-identical to `F.linear` (tests); `drop()` when a version is adopted.
# On: the CPU, bf16 weights, a oneDNN bf16 reorder for this CPU (AVX-512 BW/VL/DQ or AVX-NE-CONVERT;
# torch raises on AVX2-only), eager decoding (a compiled step traces F.linear). Elsewhere `F.linear`.
def packing_pays(weight: torch.Tensor, compiled: bool) -> bool:
    """Whether packing is on for a model whose weights are like `weight` (the comment above)."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and not compiled
            and torch.backends.mkldnn.is_available() and _ops_present())


@functools.cache
def _ops_present() -> bool:
    """The packing ops exist and this CPU can run them in bf16 (tried once on a small weight)."""
    try:
        probe = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 16, dtype=torch.bfloat16), probe, None, "none", [], "")
        return True
    except (AttributeError, RuntimeError):
        return False


class PackedLinears:
    """x @ W.T + b for the engine's weights: packed per weight where `enabled`, else F.linear."""

    def __init__(self, enabled: bool, rows_hint: int = 64) -> None:
        self.enabled, self.rows_hint = enabled, rows_hint  # rows_hint: the batch oneDNN packs for
        self._packed: dict[int, torch.Tensor] = {}  # id(weight) -> its packed copy, this version's

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not self.enabled:
            return F.linear(x, weight, bias)
        packed = self._packed.get(id(weight))
        if packed is None:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.rows_hint)
            self._packed[id(weight)] = packed
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    def module(self, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A model's own projection: packed where it is exactly `nn.Linear`, else its own forward."""
        if not self.enabled or type(linear) is not nn.Linear:
            return linear(x)
        return self(x, linear.weight, linear.bias)

    def drop(self) -> None:
        """The weights changed (a new version adopted): pack each again at its next use."""
        self._packed.clear()


@dataclass
class FusedLinear:
    """Several Linear layers over the same input as one: weight (sum of outputs, inputs)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    sizes: list[int]  # output features of each original layer, in order

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x (..., inputs) -> one (..., size) view per original layer."""
        return F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)


def fusable(linears: list[nn.Module]) -> bool:
    """Whether `linears` can share one weight tensor without changing what any of them computes."""
    if not all(type(m) is nn.Linear for m in linears):  # exactly nn.Linear: no wrapper, no subclass
        return False
    params = [p for m in linears for p in (m.weight, m.bias) if p is not None]
    if any(isinstance(p, DTensor) for p in params):
        return False
    if len({(p.dtype, p.device) for p in params}) != 1:
        return False
    biases = [m.bias is not None for m in linears]
    return all(biases) or not any(biases)


@torch.no_grad()
def fuse(linears: list[nn.Module]) -> FusedLinear | None:
    """Move the layers' weights (and biases) into one fused tensor each and re-point every layer's
    parameters at their rows of it; None, with nothing changed, where `fusable` says no."""
    if not fusable(linears):
        return None
    # no_grad, not inference mode: the parameters stay ordinary tensors an optimizer could update.
    weight = torch.cat([m.weight.detach() for m in linears])  # (sum of outputs, inputs)
    has_bias = linears[0].bias is not None
    bias = torch.cat([m.bias.detach() for m in linears]) if has_bias else None
    sizes = [m.out_features for m in linears]
    start = 0
    for m, size in zip(linears, sizes):
        m.weight.data = weight[start:start + size]  # same Parameter object, storage now the fused rows
        if bias is not None:
            m.bias.data = bias[start:start + size]
        start += size
    return FusedLinear(weight, bias, sizes)


def shares_storage(linear: nn.Linear, fused: FusedLinear) -> bool:
    """Whether `linear`'s weight still lives in `fused` (false after something rebound it)."""
    return linear.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr()


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
