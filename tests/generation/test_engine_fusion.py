"""Fused q/k/v and gate/up projections (generation/forward.py) against the module-by-module path,
before and after the weights change in place."""
import pytest
import torch
from engine_helpers import generate, tiny
from torch import nn

from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.generation.forward import FastForward, fuse, shares_storage
from aioareal.generation.scheduler import upload_padded
from aioareal.group import Group
from aioareal.weightsync.full import WeightSync

CPU = torch.device("cpu")
PROMPTS = [[5, 9, 17, 3, 40, 8, 2], [11, 4, 60], [7, 7, 21, 90, 13]]


@torch.inference_mode()
def _prefill_and_decode(fwd: FastForward, steps: int = 3) -> list[torch.Tensor]:
    """Logits of a prefill of PROMPTS, then of `steps` decode steps fed fixed tokens."""
    cache = fwd.new_cache(len(PROMPTS))
    lengths = torch.tensor([len(p) for p in PROMPTS])
    out = [fwd.logits(fwd.prefill(cache, upload_padded(PROMPTS, CPU), lengths, torch.arange(len(PROMPTS))))]
    pos = lengths.clone()
    for step in range(steps):
        tokens = torch.tensor([20 + step, 30 + step, 40 + step])
        out.append(fwd.logits(fwd.decode(cache, tokens, pos, int(pos.max()) + 1)))
        pos += 1
    return out


def _assert_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


def test_fused_prefill_and_decode_equal_the_unfused_path():
    fused_model, plain_model = tiny(), tiny()
    fused, plain = FastForward(fused_model, 32), FastForward(plain_model, 32, fuse=False)
    assert fused.fused and not plain.fused
    # Qwen2: q/k/v carry biases, gate/up do not; both kinds were fused.
    assert fused.qkv[0].bias is not None and fused.gate_up[0].bias is None
    _assert_close(_prefill_and_decode(fused), _prefill_and_decode(plain))
    # The HF modules read the fused storage too: the model's own forward is unchanged.
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        torch.testing.assert_close(fused_model(ids).logits, plain_model(ids).logits, atol=1e-5, rtol=1e-5)


def test_parameters_are_rows_of_the_fused_weight():
    model = tiny()
    fwd = FastForward(model, 16)
    for layer, qkv, gate_up in zip(model.model.layers, fwd.qkv, fwd.gate_up):
        attn, mlp = layer.self_attn, layer.mlp
        assert all(shares_storage(m, qkv) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        assert all(shares_storage(m, gate_up) for m in (mlp.gate_proj, mlp.up_proj))
        assert isinstance(attn.q_proj.weight, nn.Parameter) and attn.q_proj.weight.is_contiguous()
        torch.testing.assert_close(qkv.weight[-attn.v_proj.out_features:], attn.v_proj.weight, atol=0, rtol=0)


def test_weight_sync_into_a_fused_engine_changes_prefill_and_decode():
    """WeightSync copies into the HF parameters in place; the fused engine must compute with the new
    weights, as an unfused forward over a fresh model holding them does."""
    gen_model, trainer_model = tiny(seed=3), tiny(seed=4)
    fwd = FastForward(gen_model, 32)
    before = _prefill_and_decode(fwd)
    sync = WeightSync(trainer_model, gen_model)
    sync.publish(1)
    assert sync.apply() == (1, None)
    after = _prefill_and_decode(fwd)
    assert not torch.allclose(before[0], after[0], atol=1e-3)  # the new weights differ: a real check
    _assert_close(after, _prefill_and_decode(FastForward(tiny(seed=4), 32, fuse=False)))


def test_direct_param_copy_reaches_the_fused_projection():
    model, reference = tiny(), tiny()
    fwd = FastForward(model, 32)
    _prefill_and_decode(fwd)  # run once first, as an engine would have before the update
    with torch.no_grad():
        for m in (model, reference):
            m.model.layers[1].self_attn.k_proj.bias.copy_(torch.full((64,), 0.5))
            m.model.layers[2].mlp.up_proj.weight.mul_(-1.0)
    _assert_close(_prefill_and_decode(fwd), _prefill_and_decode(FastForward(reference, 32, fuse=False)))


def _engine_run(fuse: bool) -> list:
    params = SamplingParams(temperature=0.9, max_new_tokens=10)
    engine = Engine(tiny(), [1], EngineOptions(num_slots=4, max_len=32, params=params, seed=2, fuse=fuse))
    out = generate(engine, [Group(gid, prompt, size=2) for gid, prompt in enumerate(PROMPTS)])
    return [c for r in sorted(out, key=lambda r: r.group_id) for c in r.completions]


def test_engine_samples_the_same_with_and_without_fusion():
    fused, plain = _engine_run(True), _engine_run(False)
    assert [c.tokens for c in fused] == [c.tokens for c in plain]
    for a, b in zip(fused, plain):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)


class _Wrapped(nn.Linear):
    """Stands in for a LoRA wrapper or a quantised layer: not exactly nn.Linear."""


@pytest.mark.parametrize("case", ["subclass", "mixed_bias", "mixed_dtype"])
def test_unsafe_projections_are_left_alone(case):
    layers = [nn.Linear(8, 4), nn.Linear(8, 4)]
    if case == "subclass":
        layers[1] = _Wrapped(8, 4)
    elif case == "mixed_bias":
        layers[1] = nn.Linear(8, 4, bias=False)
    else:
        layers[1] = layers[1].double()
    pointers = [p.data_ptr() for m in layers for p in m.parameters()]
    assert fuse(layers) is None
    assert [p.data_ptr() for m in layers for p in m.parameters()] == pointers


def test_evaluation_engine_leaves_the_trainers_model_unfused():
    from aioareal.evaluation.scored_completions import EvalSet, evaluate
    from aioareal.rewards.service import RewardService, per_item

    model = tiny()
    pointers = [p.data_ptr() for p in model.parameters()]
    evaluate(model, EvalSet([None], [PROMPTS[0]]), RewardService(per_item(lambda text, ex: 1.0), str), [1],
             max_new_tokens=3)
    assert [p.data_ptr() for p in model.parameters()] == pointers

