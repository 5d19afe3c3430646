"""Where the models run other code than transformers' own: their attention and, in training, their
norms and MLPs.

The attention the trainer's Hugging Face models run (registered as "aioareal"): transformers' SDPA
path, except for few keys on the CPU, where two batched matmuls and a softmax (query heads grouped
onto their key heads) cost less than torch's CPU flash kernel; results equal SDPA's to rounding.

Sequences packed into one row (trainer/batching.py) arrive with `cu_seq_lens_q` and attend within
their own sequence: torch's varlen kernel on CUDA, SDPA per sequence on the CPU, else one SDPA under
a block-diagonal causal mask.

**Lean layers**: leaner activations for the trained model's RMSNorms and SwiGLU MLPs
(train.lean_activations).

What autograd keeps is most of a step's memory beyond weights and AdamW (docs/log/2026-11-memory.md),
and transformers' chains of small ops each keep their inputs. `_RMSNorm` keeps the input and the
per-row rsqrt, not also the fp32 normalised input, and normalises again in the backward; `_SwiGLU`
keeps gate and up and recomputes silu(gate). Both compute the forward op for op as the modules do,
and the gradients to rounding. A forward is swapped only after a probe on random inputs shows the
two agree (`make_lean`): a family that writes its norm otherwise (Gemma's `1 + weight`) keeps its own.
"""
from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

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


# -- lean layers (train.lean_activations) -------------------------------------------------------------
def _wide(x: torch.Tensor) -> torch.dtype:
    """The norm's compute dtype: fp32 for 16- and 32-bit inputs, as the modules cast (fp64 stays)."""
    return torch.promote_types(x.dtype, torch.float32)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(_wide(x))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, rstd, weight = ctx.saved_tensors
        normed = x.to(_wide(x)) * rstd
        grad = grad.to(normed.dtype)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * normed.to(x.dtype)).reshape(-1, weight.shape[-1]).sum(0).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            scaled = grad * weight.to(normed.dtype)  # d loss / d normed
            grad_x = (rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_weight, None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate)  # the kernel SiLU's own backward uses
        return grad_gate, grad * F.silu(gate)


MLP_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")


def _lean_norm(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    return _RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _lean_mlp(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(_SwiGLU.apply(self.gate_proj(x), self.up_proj(x)))


def _kind(module: nn.Module) -> Any:
    """The lean forward this module might take, or None when it is neither block."""
    if isinstance(getattr(module, "variance_epsilon", None), float) and getattr(module, "weight", None) is not None \
            and module.weight.dim() == 1:
        return _lean_norm
    if all(isinstance(getattr(module, name, None), nn.Module) for name in MLP_PARTS):
        return _lean_mlp
    return None


def _agrees(module: nn.Module, lean: Any, width: int) -> bool:
    """Whether `lean` computes the module's own forward's values and gradients on random inputs."""
    weight = next(module.parameters())
    draws = torch.Generator().manual_seed(0)  # the probe leaves the run's random state alone
    x = torch.randn(2, 5, width, generator=draws).to(weight.device, weight.dtype)
    results = []
    for forward in (module.forward, types.MethodType(lean, module)):
        module.zero_grad(set_to_none=True)
        probe = x.clone().requires_grad_(True)
        out = forward(probe)
        (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
        grads = [p.grad for p in module.parameters() if p.requires_grad]
        results.append([out.detach(), probe.grad, *grads])
    module.zero_grad(set_to_none=True)
    tol = {"atol": 1e-4, "rtol": 1e-3} if weight.dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    return all(torch.allclose(a.float(), b.float(), **tol) for a, b in zip(results[0], results[1]))


def make_lean(model: nn.Module) -> int:
    """Give each RMSNorm and SwiGLU MLP whose class passes the probe (one per class and width) its
    lean forward, on the instance; returns how many took it."""
    verdicts: dict[tuple[type, int], bool] = {}
    swapped = 0
    for module in model.modules():
        lean = _kind(module)
        if lean is None or "forward" in vars(module):  # a forward set on the instance (compiled, ...) stays
            continue
        width = module.weight.shape[0] if lean is _lean_norm else getattr(module.gate_proj, "in_features", None)
        key = (type(module), width)
        if width is None:
            continue
        if key not in verdicts:
            verdicts[key] = _agrees(module, lean, width)
        if verdicts[key]:
            module.forward = types.MethodType(lean, module)
            swapped += 1
    return swapped
