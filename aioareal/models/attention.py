"""The attention the trainer's Hugging Face models run (registered as "aioareal"): transformers' SDPA
path, except for few keys on the CPU, where two batched matmuls and a softmax (query heads grouped
onto their key heads) cost less than torch's CPU flash kernel; results equal SDPA's to rounding.

Sequences packed into one row (trainer/batching.py) arrive with `cu_seq_lens_q` and attend within
their own sequence: torch's varlen kernel on CUDA, SDPA per sequence on the CPU, else one SDPA under
a block-diagonal causal mask.
"""
from __future__ import annotations

import torch

try:  # torch's variable-length flash attention (CUDA only), torch >= 2.10
    from torch.nn.attention.varlen import varlen_attn
except ImportError:
    varlen_attn = None

try:  # pluggable attention functions and masks: transformers >= 4.53
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError:  # older transformers: models load with plain SDPA (correct, slower on the CPU)
    AttentionInterface = None

ATTENTION = "aioareal" if AttentionInterface is not None else "sdpa"
# Longest key length that takes the matmul path on the CPU. In fp32 torch's flash kernel wins from a
# few dozen keys on; in bf16 its backward is slower (and transformers repeats the key heads for it),
# so the matmuls win up to a few hundred keys (docs/log/2026-11-smollm2-cpu.md).
SHORT_KEYS = 64
SHORT_KEYS_16BIT = 160


def short_keys(dtype: torch.dtype) -> int:
    return SHORT_KEYS_16BIT if dtype in (torch.bfloat16, torch.float16) else SHORT_KEYS


def matmul_attention_pays(q: torch.Tensor) -> bool:
    """The engine's attention as `short_attention`'s matmuls rather than SDPA: on the CPU in 16-bit, where torch's
    flash kernel is several times slower; in fp32 SDPA wins (docs/log/2026-11-avx512-cpu.md)."""
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)


def compute_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype attention's matmuls run in: under CPU autocast the autocast dtype, though the query
    arrives in fp32 (rotary embeddings multiply by fp32 tables, which autocast does not cast)."""
    if query.dtype == torch.float32 and torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return query.dtype


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query (b, H, q, D), key/value (b, Hkv, k, D), mask broadcastable to (b, 1, q, k), bool
    (True attends) or additive -> (b, q, H, D), as transformers' attention functions return."""
    if kwargs.get("cu_seq_lens_q") is not None:  # one packed row: attend within each sequence
        return packed_attention(query, key, value, kwargs["cu_seq_lens_q"], kwargs["max_length_q"], scaling), None
    if kwargs.get("softcap") is not None:  # Gemma 2's capped scores, which transformers' SDPA path refuses
        return short_attention(query, key, value, attention_mask, scaling, kwargs["softcap"]), None
    if (query.device.type != "cpu" or key.shape[2] > short_keys(compute_dtype(query)) or dropout
            or kwargs.get("position_bias") is not None
            or (is_causal is False and attention_mask is None)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    return short_attention(query, key, value, attention_mask, scaling), None


def short_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None,
                    softcap: float | None = None) -> torch.Tensor:
    """Causal (or masked) attention as matmuls; the H query heads are grouped by their Hkv key head.
    `softcap`: scores become softcap * tanh(scores / softcap) before the mask (Gemma 2)."""
    b, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = scaling if scaling is not None else dim ** -0.5
    q = (query * scale).reshape(b, kv_heads, group * q_len, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)).view(b, kv_heads, group, q_len, kv_len)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is None:
        # As transformers' SDPA path reads a missing mask: one query attends to every key; several
        # are causal from the first key (the keys past them are a static cache's empty slots).
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(
            kv_len - 1 if q_len == 1 else 0)
    # In place on the matmul's output (its backward needs only the inputs); the softmax in the scores'
    # dtype, since torch's CPU kernel accumulates a 16-bit row in fp32 and rounds once anyway.
    if attention_mask.dtype == torch.bool:
        # The lowest value, not -inf: a row with no key (padding) gets finite weights, not NaN.
        mask = attention_mask if attention_mask.dim() == 2 else attention_mask[:, :, None]
        scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    else:
        scores.add_(attention_mask if attention_mask.dim() == 2 else attention_mask[:, :, None])
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs.view(b, kv_heads, group * q_len, kv_len), value)
    return out.view(b, heads, q_len, dim).transpose(1, 2).contiguous()


def varlen_kernel_available(device: torch.device) -> bool:
    return device.type == "cuda" and varlen_attn is not None


def packed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_len: int, scaling: float | None) -> torch.Tensor:
    """Causal attention within each sequence of one packed row: query (1, H, T, D), key/value
    (1, Hkv, T, D), cu_seqlens (n + 1,) int32 -> (1, T, H, D)."""
    if varlen_kernel_available(query.device):
        # The kernel takes (T, heads, D); window (-1, 0) is causal.
        out = varlen_attn(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                          cu_seqlens, cu_seqlens, max_len, max_len, scale=scaling, window_size=(-1, 0),
                          enable_gqa=key.shape[1] != query.shape[1])
        return out[None]
    gqa = key.shape[1] != query.shape[1]
    if query.device.type == "cpu":  # per sequence: no FLOPs across sequences; the bounds are host ints
        bounds = cu_seqlens.tolist()
        parts = [torch.nn.functional.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=True, scale=scaling, enable_gqa=gqa)
            for s, e in zip(bounds, bounds[1:])]
        return torch.cat(parts, dim=2).transpose(1, 2).contiguous()
    # A GPU without the kernel: one SDPA under the block-diagonal mask (reading the bounds would sync).
    mask = block_causal_mask(cu_seqlens, query.shape[2])
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                                           enable_gqa=gqa)
    return out.transpose(1, 2).contiguous()


def block_causal_mask(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """(1, 1, T, T) bool: a query attends to the keys of its own sequence up to itself."""
    pos = torch.arange(length, device=cu_seqlens.device)
    seq = torch.bucketize(pos, cu_seqlens[1:].to(torch.long), right=True)  # each position's sequence
    same = seq[:, None] == seq[None, :]
    return (same & (pos[None, :] <= pos[:, None]))[None, None]


if AttentionInterface is not None:
    AttentionInterface.register(ATTENTION, attention_forward)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the same masks as "sdpa"
