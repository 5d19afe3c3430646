"""train.varlen: a micro-batch's sequences in one row, attended per sequence (trainer/batching.py,
models/ops.py packed_attention)."""
from __future__ import annotations

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from layout_helpers import (
    assert_layout_equals_padded,
    assert_rows_independent,
    assert_same_step,
    random_batches,
    rewarded_groups,
    sample,
    train_one_step,
)

from aioareal.errors import UserError
from aioareal.group import Sample
from aioareal.models import random_model
from aioareal.models.ops import block_causal_mask, packed_attention
from aioareal.trainer.batching import Layouts, VarlenRows, build_varlen, collate, use_varlen


def samples_from(rng: random.Random, n: int, long: int = 20) -> list[Sample]:
    return [sample([rng.randrange(3, 100) for _ in range(rng.randint(1, long))],
                   [rng.randrange(3, 100) for _ in range(rng.randint(1, long))]) for _ in range(n)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=8))
def test_the_one_row_layout_holds_every_token_once_and_points_at_each_target(lengths):
    samples = [sample(list(range(10, 10 + p)), list(range(50, 50 + c))) for p, c in lengths]
    rows = build_varlen(samples)
    ids, bounds = rows.input_ids[0].tolist(), rows.cu_seqlens.tolist()
    assert bounds[0] == 0 and bounds[-1] == len(ids) == sum(p + c for p, c in lengths)
    for s, start, end in zip(samples, bounds, bounds[1:]):
        assert ids[start:end] == s.prompt_ids + s.tokens  # every token once, in order
        assert rows.position_ids[0, start:end].tolist() == list(range(end - start))
    assert rows.max_len == max(p + c for p, c in lengths)
    # Each target index is the position predicting a completion token, in loss_mask's order.
    mb = collate(samples, 0, torch.device("cpu"))
    assert [ids[i + 1] for i in rows.target_index.tolist()] == mb.input_ids[:, 1:][mb.loss_mask].tolist()


def test_the_block_causal_mask_attends_within_each_sequence_up_to_itself():
    mask = block_causal_mask(torch.tensor([0, 2, 5], dtype=torch.int32), 5)[0, 0]
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]])
    assert torch.equal(mask, expected.bool())


def test_packed_attention_on_the_cpu_equals_the_block_mask_sdpa():
    torch.manual_seed(0)
    cu = torch.tensor([0, 3, 10, 11, 20], dtype=torch.int32)
    q, k, v = torch.randn(1, 4, 20, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8)
    out = packed_attention(q, k, v, cu, 9, None)
    mask = block_causal_mask(cu, 20)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_one_row_log_probs_and_gradients_equal_the_padded_ones():
    model = random_model("tiny", torch.float32, torch.device("cpu"))
    mb = collate(samples_from(random.Random(1), 7), 0, torch.device("cpu"), Layouts(varlen=True))
    assert isinstance(mb.layout, VarlenRows)
    assert_layout_equals_padded(model, mb, mb.layout)


def test_no_token_attends_across_a_sequence_boundary():
    model = random_model("tiny", torch.float32, torch.device("cpu"))
    samples = samples_from(random.Random(2), 4)
    changed = copy.deepcopy(samples)
    changed[1] = sample([7] * len(samples[1].prompt_ids), [9] * len(samples[1].tokens))  # same length, other tokens
    assert_rows_independent(model, samples, changed, 1, Layouts(varlen=True))


def test_a_training_step_in_one_rows_equals_the_padded_one():
    """Gradient checkpointing turns the shared prompts off, so the micro-batches are padded or varlen."""
    steps = {}
    for varlen in (False, True):
        groups = rewarded_groups(random_batches(random.Random(3), 4, 4))
        steps[varlen] = train_one_step(["model.gradient_checkpointing=true", f"train.varlen={str(varlen).lower()}",
                                        "train.prefix_tree=false"], groups)
        packed = steps[varlen][2]
        assert all(isinstance(mb.layout, VarlenRows) if varlen else mb.layout is None for mb in packed)
    assert_same_step(steps[True], steps[False], ("loss", "grad_norm"))


def test_auto_stays_padded_on_the_cpu_and_true_needs_the_project_attention():
    model = random_model("tiny", torch.float32, torch.device("cpu"))
    assert use_varlen("auto", torch.device("cpu"), model) is False
    assert use_varlen(True, torch.device("cpu"), model) is True
    model.config._attn_implementation = "sdpa"
    with pytest.raises(UserError, match="train.varlen"):
        use_varlen(True, torch.device("cpu"), model)


@pytest.mark.gpu
def test_the_cuda_varlen_kernel_equals_the_block_mask_reference_in_bf16():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    cu = torch.tensor([0, 30, 100, 101, 256], dtype=torch.int32, device="cuda")
    q = torch.randn(1, 14, 256, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = packed_attention(q, k, v, cu, 70, None)
    ref = packed_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(), cu.cpu(), 70, None)
    torch.testing.assert_close(out.float().cpu(), ref, rtol=2e-2, atol=2e-2)
