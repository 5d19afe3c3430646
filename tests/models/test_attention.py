"""The trainer's attention (models/ops.py): the CPU matmul path for short sequences equals
SDPA, values and gradients, and long sequences go to SDPA itself."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal.models import ops, random_model
from aioareal.trainer.logprobs import token_logprobs


def _reference(query, key, value, mask):
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    if mask is None:  # transformers' reading: one query sees every key, several are causal from key 0
        q_len, k_len = query.shape[2], key.shape[2]
        mask = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - 1 if q_len == 1 else 0)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(b=st.integers(1, 4), kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 2, 3]),
       q_len=st.integers(1, 9), past=st.integers(0, 6), padded=st.booleans())
def test_property_short_attention_equals_sdpa_with_its_gradients(b, kv_heads, group, q_len, past, padded):
    torch.manual_seed(b * 100 + q_len * 10 + past)
    k_len = q_len + past
    q = torch.randn(b, kv_heads * group, q_len, 8, requires_grad=True)
    k = torch.randn(b, kv_heads, k_len, 8, requires_grad=True)
    v = torch.randn(b, kv_heads, k_len, 8, requires_grad=True)
    mask = None  # transformers passes none only for plain causal attention
    if padded or past:  # keys cached before the queries, or right padding: the mask transformers builds
        lengths = torch.randint(1, k_len + 1, (b,)) if padded else torch.full((b,), k_len)
        causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(past)
        mask = (causal[None] & (torch.arange(k_len)[None, :] < lengths[:, None])[:, None, :])[:, None]
        mask[..., 0] = True  # every query sees at least the first key (SDPA gives NaN otherwise)
    ours = ops.short_attention(q, k, v, mask, None)
    theirs = _reference(q, k, v, mask)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    weights = torch.randn_like(ours)
    grads = torch.autograd.grad((ours * weights).sum(), (q, k, v))
    expected = torch.autograd.grad((theirs * weights).sum(), (q, k, v))
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def test_without_a_mask_one_query_sees_every_key():  # a decode step, as transformers' SDPA path reads it
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    theirs = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    torch.testing.assert_close(ops.short_attention(q, k, v, None, None), theirs.transpose(1, 2))


def test_a_query_with_no_key_to_attend_stays_finite():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    mask = torch.zeros(1, 1, 3, 3, dtype=torch.bool)
    assert torch.isfinite(ops.short_attention(q, k, v, mask, None)).all()


def test_long_keys_and_other_devices_take_transformers_sdpa(monkeypatch):
    calls = []
    monkeypatch.setattr(ops, "sdpa_attention_forward", lambda *a, **k: calls.append(a[2].shape) or (None, None))
    module = torch.nn.Module()
    short = torch.randn(1, 2, ops.SHORT_KEYS, 4)
    long = torch.randn(1, 2, ops.SHORT_KEYS + 1, 4)
    out, _ = ops.attention_forward(module, short, short, short, None)
    assert out.shape == (1, ops.SHORT_KEYS, 2, 4) and not calls
    ops.attention_forward(module, long, long, long, None)
    ops.attention_forward(module, short, short, short, None, dropout=0.1)
    assert calls == [long.shape, short.shape]


def test_under_cpu_autocast_fp32_queries_take_the_16bit_key_limit(monkeypatch):
    # The trainer's bf16 autocast hands attention fp32 queries (rotary embeddings multiply by fp32
    # tables); its matmuls run in bf16 all the same, so the bf16 limit applies, not fp32's.
    calls = []
    monkeypatch.setattr(ops, "sdpa_attention_forward", lambda *a, **k: calls.append(a[2].shape) or (None, None))
    module = torch.nn.Module()
    middle = torch.randn(1, 2, ops.SHORT_KEYS_16BIT, 4)
    ops.attention_forward(module, middle, middle, middle, None)
    assert calls == [middle.shape]  # fp32 without autocast: SDPA
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = ops.attention_forward(module, middle, middle, middle, None)
        longer = torch.randn(1, 2, ops.SHORT_KEYS_16BIT + 1, 4)
        ops.attention_forward(module, longer, longer, longer, None)
    assert out.dtype == torch.bfloat16 and calls == [middle.shape, longer.shape]


@pytest.mark.parametrize("shared", [False, True])
def test_models_load_with_it_and_log_probs_match_sdpa(shared):
    from aioareal.group import Completion, Sample
    from aioareal.trainer.batching import Layouts, pack

    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=3)
    assert model.config._attn_implementation == ops.ATTENTION
    samples = [Sample([4, 5, 6, 7][:p], Completion(list(range(20, 20 + n)), [0.0] * n, [0] * n), 1.0)
               for p, n in ((3, 5), (4, 2), (3, 6), (4, 1))]
    mb = pack(samples, budget=10_000, pad_id=0, device=torch.device("cpu"), layouts=Layouts(share=shared))[0]
    ours = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, layout=mb.layout)[0]
    model.config._attn_implementation = "sdpa"
    theirs = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, layout=mb.layout)[0]
    assert (mb.layout is not None) == shared
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
