"""Shared-prefix decode attention (generation/prefix.py): the merged prefix + suffix softmax equals
attention over each row's own keys, reads the prompt from the group's leader only, and an engine
with it generates what the plain engine does (greedy), through slot reuse, overlap and adoption."""
import pytest
import torch
from engine_helpers import (
    assert_same_completions,
    mixed_groups,
    new_weights_after,
    run_to_end,
    wandering_engine,
    wandering_model,
)

from aioareal.generation.prefix import layout_of, shared_prefix_attention
from aioareal.generation.scheduler import Running
from aioareal.group import Completion, Group


def _scene(dtype=torch.float32, slots=12, max_len=40, kv_heads=2, heads=6, dim=8):
    """Three groups (sizes 3, 1, 4) with prompts of 9, 5 and 13 tokens in scattered slots, each
    sample somewhere past its prompt; every slot of a group holds the same prompt keys."""
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(slots, max_len, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(slots, max_len, kv_heads, dim, generator=gen).to(dtype)
    running, pos = {}, {}
    for members, prompt, done in (([4, 0, 7], 9, [3, 11, 0]), ([2], 5, [20]), ([9, 1, 11, 5], 13, [1, 6, 2, 14])):
        group = Group(len(running), [0] * prompt, len(members))
        for i, (slot, steps) in enumerate(zip(members, done)):
            k[slot, :prompt], v[slot, :prompt] = k[members[0], :prompt], v[members[0], :prompt]
            running[slot] = Running(group, i, slot, Completion(), prompt_len=prompt)
            pos[slot] = prompt + steps
    q = torch.randn(len(running), heads, dim, generator=gen).to(dtype)
    return q, k, v, running, torch.tensor([pos[s] for s in sorted(running)])


def _reference(q, k, v, rows, pos):
    """Each row attends over its own slot's keys [0, pos], by SDPA in fp32."""
    out = []
    rep = q.shape[1] // k.shape[2]
    for i, (slot, p) in enumerate(zip(rows.tolist(), pos.tolist())):
        keys = k[slot, :p + 1].float().repeat_interleave(rep, 1).transpose(0, 1)  # (H, S, D)
        values = v[slot, :p + 1].float().repeat_interleave(rep, 1).transpose(0, 1)
        out.append(torch.nn.functional.scaled_dot_product_attention(q[i].float()[:, None], keys, values)[:, 0])
    return torch.stack(out).flatten(1)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_merged_attention_equals_attention_over_each_rows_keys(dtype, tol):
    q, k, v, running, pos = _scene(dtype)
    layout = layout_of(running, torch.device("cpu"))
    assert (layout.groups, layout.width, layout.longest, layout.shortest) == (3, 4, 13, 5)
    span = int(pos.max()) + 1
    got = shared_prefix_attention(q, k, v, pos, span, layout)
    torch.testing.assert_close(got.float(), _reference(q, k, v, layout.rows, pos), atol=tol, rtol=tol)


def test_the_prompt_is_read_from_the_leader_only():
    """Corrupting a non-leader's copy of its prompt changes nothing; corrupting the leader's does."""
    q, k, v, running, pos = _scene()
    layout = layout_of(running, torch.device("cpu"))
    span = int(pos.max()) + 1
    base = shared_prefix_attention(q, k, v, pos, span, layout)
    assert layout.leaders.tolist() == [0, 1, 2]  # the lowest decoded slot of each group
    other = k.clone()
    other[4, :9] += 5.0  # slot 4: same group as leader 0, prompt of 9
    torch.testing.assert_close(shared_prefix_attention(q, other, v, pos, span, layout), base)
    other[0, :9] += 5.0
    assert not torch.allclose(shared_prefix_attention(q, other, v, pos, span, layout), base)


def test_the_layout_is_rebuilt_only_when_the_running_set_changes():
    _, _, _, running, _ = _scene()
    first = layout_of(running, torch.device("cpu"))
    assert layout_of(running, torch.device("cpu"), first) is first
    del running[0]  # the leader of group 0 finished: slot 4 leads it now
    again = layout_of(running, torch.device("cpu"), first)
    assert again is not first and again.leaders.tolist() == [1, 2, 4]


@pytest.mark.parametrize("overlap", [False, True])
def test_an_engine_with_shared_prefix_generates_what_the_plain_one_does(overlap):
    """18 sequences through 6 slots (leaders finish first and their slots take new groups), forced
    and EOS ends, mixed group sizes."""
    plain, _ = run_to_end(wandering_engine(overlap), mixed_groups())
    engine = wandering_engine(overlap, shared_prefix=True)
    assert engine.shared_prefix
    shared, _ = run_to_end(engine, mixed_groups())
    assert_same_completions(plain, shared)


def test_shared_prefix_with_a_mid_rollout_adopt_and_recompute():
    plain, _ = run_to_end(wandering_engine(False, slots=10), mixed_groups()[:4], new_weights_after(5))
    shared, _ = run_to_end(wandering_engine(False, slots=10, shared_prefix=True),
                                   mixed_groups()[:4], new_weights_after(5))
    assert_same_completions(plain, shared)
    assert any(c.versions[0] == 0 and c.versions[-1] == 1 for cs in shared.values() for c in cs)


@pytest.mark.gpu
def test_cuda_shared_prefix_matches_plain_greedy_in_bf16():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    q, k, v, running, pos = _scene(torch.bfloat16)
    layout = layout_of(running, torch.device("cuda"))
    got = shared_prefix_attention(q.cuda(), k.cuda(), v.cuda(), pos.cuda(), int(pos.max()) + 1, layout)
    want = _reference(q, k, v, layout.rows.cpu(), pos)
    torch.testing.assert_close(got.float().cpu(), want, atol=2e-2, rtol=2e-2)
    model = wandering_model("cuda")
    plain, _ = run_to_end(wandering_engine(True, model=model, cuda_graphs=False), mixed_groups())
    shared, _ = run_to_end(wandering_engine(True, model=model, cuda_graphs=False, shared_prefix=True),
                                   mixed_groups())
    assert_same_completions(plain, shared)
