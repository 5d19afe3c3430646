"""Every model family the engine claims (aioareal/generation/forward.py), proven against the model's
own forward: tiny random models (2 layers, hidden 64) built from transformers' config classes, fp32,
the engine's sampled tokens' log-probs against one full HF forward over prompt + completion (prefill
and decode), with the weights changed and adopted mid-rollout, and sliding windows shorter than the
sequences. Families the engine does not implement get a one-line reason instead."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import transformers as tf
from engine_helpers import generate, new_weights_after, random_groups, reference_logprobs

from aioareal.config import load_config
from aioareal.errors import UserError
from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.generation.backends import HFEngine, checked, choose, gap_bound, make_engine, startup_gap
from aioareal.generation.family_forward import FamilyForward, build_forward
from aioareal.generation.forward import unsupported_reason
from aioareal.group import Completion, Group, Sample
from aioareal.trainer import Trainer

SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
WINDOW = 4  # shorter than every sequence below (prompts of 2 to 13 tokens, then 10 new)
ROPE = {"rope_theta": 10000.0}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0 + i / 8 for i in range(8)],
            "long_factor": [2.0 + i / 4 for i in range(8)], "original_max_position_embeddings": 64, **ROPE}

# family -> (config class, its settings beyond SHAPE); the config each family's users meet.
FAMILIES = {
    "llama": (tf.LlamaConfig, {}),
    "llama3-rope": (tf.LlamaConfig, {"rope_parameters": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16, **ROPE}}),
    "llama-linear-rope": (tf.LlamaConfig, {"rope_parameters": {"rope_type": "linear", "factor": 2.0, **ROPE}}),
    "llama-dynamic-rope": (tf.LlamaConfig, {"max_position_embeddings": 64,
                                            "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, **ROPE}}),
    "llama-yarn-rope": (tf.LlamaConfig, {"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, **ROPE}}),
    "llama-longrope": (tf.LlamaConfig, {"rope_parameters": LONGROPE}),
    "mistral-window": (tf.MistralConfig, {"sliding_window": WINDOW}),
    "qwen2-window": (tf.Qwen2Config, {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    "qwen3": (tf.Qwen3Config, {"head_dim": 16}),
    "gemma": (tf.GemmaConfig, {"head_dim": 16, "hidden_act": "gelu_pytorch_tanh"}),
    "gemma2": (tf.Gemma2Config, {"head_dim": 16, "sliding_window": WINDOW, "query_pre_attn_scalar": 24,
                                 "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0}),
    "gemma3": (tf.Gemma3TextConfig, {"head_dim": 16, "sliding_window": WINDOW, "query_pre_attn_scalar": 24,
                                     "layer_types": ["sliding_attention", "full_attention"],
                                     "final_logit_softcapping": 3.0}),
    "phi3": (tf.Phi3Config, {"sliding_window": WINDOW + 1, "rope_parameters": {
        "rope_type": "default", "partial_rotary_factor": 0.5, **ROPE}}),
    "phi3-longrope": (tf.Phi3Config, {"original_max_position_embeddings": 64, "rope_parameters": LONGROPE}),
    "olmo2": (tf.Olmo2Config, {}),
    "granite": (tf.GraniteConfig, {"embedding_multiplier": 6.0, "attention_multiplier": 0.2,
                                   "residual_multiplier": 0.4, "logits_scaling": 2.5}),
    "smollm3": (tf.SmolLM3Config, {"no_rope_layers": [1, 0], "layer_types": ["full_attention"] * 2}),
}


def family_model(family: str, seed: int = 0) -> torch.nn.Module:
    """The family's tiny model with weights drawn large enough that every part shows in the logits
    (transformers' init leaves norms at 1 or 0 and logits almost flat)."""
    cls, extra = FAMILIES[family]
    config = cls(**{**SHAPE, **extra})
    config._attn_implementation = "eager"  # the reference every other attention path is held to
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(noise * 0.15 if p.dim() == 2 else 1 + 0.2 * noise)
    return model


def engine_for(model: torch.nn.Module, **kw) -> Engine:
    params = SamplingParams(max_new_tokens=10)
    return Engine(model, [2], EngineOptions(num_slots=6, max_len=48, params=params, seed=1, **kw))


def assert_matches_reference(results, references: dict[int, torch.nn.Module]) -> None:
    """Each token's log-prob equals the full forward of the weights of the version it was sampled under."""
    checked = 0
    for group in results:
        for c in group.completions:
            for version, model in references.items():
                ref = reference_logprobs(model, group.prompt_ids, c.tokens)
                at = [j for j, v in enumerate(c.versions) if v == version]
                torch.testing.assert_close(torch.tensor(c.logprobs)[at], ref[at], atol=1e-4, rtol=1e-4)
                checked += len(at)
    assert checked > 20


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_engine_logprobs_equal_the_models_own_forward(family):
    model = family_model(family)
    assert unsupported_reason(model.config, 48) is None
    before = copy.deepcopy(model)  # the weights of version 0, kept before the engine fuses them
    results = generate(engine_for(model), random_groups([2, 3, 1]), new_weights_after(4))
    assert {v for r in results for c in r.completions for v in c.versions} == {0, 1}
    assert_matches_reference(results, {0: before, 1: model})


@pytest.mark.parametrize("family", ["mistral-window", "gemma2", "phi3"])
def test_families_match_without_fused_projections(family):
    model = family_model(family, seed=1)
    results = generate(engine_for(model, fuse=False), random_groups([2, 2], seed=1))
    assert_matches_reference(results, {0: model})


def test_plain_llama_and_qwen_keep_the_fast_path_and_the_others_do_not():
    assert type(build_forward(family_model("llama3-rope"), 16)).__name__ == "FastForward"
    assert type(build_forward(family_model("qwen3"), 16)).__name__ == "FastForward"
    for family in ("mistral-window", "qwen2-window", "gemma", "phi3", "granite", "smollm3"):
        assert isinstance(build_forward(family_model(family), 16), FamilyForward), family


UNSUPPORTED = {
    "gpt_neox": tf.GPTNeoXConfig(),
    "qwen3_moe": tf.Qwen3MoeConfig(),
    "mixtral": tf.MixtralConfig(),
    "gemma3 multimodal": tf.Gemma3Config(),
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_families_the_engine_does_not_implement_get_a_reason(name):
    config = UNSUPPORTED[name]
    reason = unsupported_reason(config)
    assert reason is not None and config.model_type in reason and "\n" not in reason


def test_length_dependent_rope_is_refused_past_its_original_length():
    config = family_model("llama-dynamic-rope").config  # max_position_embeddings 64
    assert unsupported_reason(config, 64) is None
    assert "dynamic" in unsupported_reason(config, 65)
    longrope = family_model("llama-longrope").config  # original length 64
    assert "longrope" in unsupported_reason(longrope, 100)


def test_auto_sends_a_length_dependent_rope_past_its_original_length_to_the_fallback():
    """`auto` decides with the engine's context: within the original length the engine is exact,
    past it the fallback (the model's own forward, whose RoPE follows the length) generates."""
    model = family_model("llama-dynamic-rope")  # max_position_embeddings 64
    options = EngineOptions(num_slots=2, max_len=48, params=SamplingParams(max_new_tokens=8))
    assert choose(model, "auto", 48) == ("engine", None) and isinstance(make_engine(model, [2], options), Engine)
    kind, reason = choose(model, "auto", 128)
    assert kind == "hf" and "dynamic" in reason
    assert isinstance(make_engine(model, [2], replace(options, max_len=128)), HFEngine)
    with pytest.raises(UserError, match="RoPE type 'dynamic' changes its frequencies past 64 tokens"):
        choose(model, "engine", 128)


def test_unknown_rope_type_is_refused():
    config = tf.LlamaConfig(**SHAPE)
    config.rope_parameters = {"rope_type": "made-up", "rope_theta": 10000.0}
    assert "made-up" in unsupported_reason(config)


def test_engine_refuses_an_unsupported_model_in_one_line():
    config = tf.GPTNeoXConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4)
    model = tf.AutoModelForCausalLM.from_config(config)
    with pytest.raises(UserError, match="model_type 'gpt_neox' is not implemented by the engine"):
        engine_for(model)


@pytest.mark.parametrize("family", ["gemma2", "mistral-window"])
def test_the_trainers_attention_computes_soft_caps_and_windows(family):
    """The project's attention (models/ops.py), which the trainer's forward runs, equals eager
    attention on Gemma 2's soft-capped scores and on sliding windows (padded batch included)."""
    from aioareal.models.ops import ATTENTION

    model = family_model(family)
    ids = torch.arange(4, 20).repeat(2, 1)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    reference = model(ids, attention_mask=mask).logits
    model.config._attn_implementation = ATTENTION
    ours = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(ours[0], reference[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours[1, 5:], reference[1, 5:], atol=1e-4, rtol=1e-4)


def shared_prompt_groups() -> list[Group]:
    """Two groups of two samples each, prompt + completion longer than WINDOW."""
    gen = torch.Generator().manual_seed(0)
    groups = []
    for gid in range(2):
        prompt = torch.randint(4, 100, (6 + gid,), generator=gen).tolist()
        group = Group(gid, prompt, size=2)
        for i in range(2):
            tokens = torch.randint(4, 100, (9 + i,), generator=gen).tolist()
            completion = Completion(tokens, [0.0] * len(tokens), [0] * len(tokens), "stop")
            group.samples.append(Sample(prompt, completion, 0.0))
        groups.append(group)
    return groups


WINDOWED = {"mistral-window", "qwen2-window", "gemma2", "gemma3", "phi3"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_trainers_logprobs_equal_the_models_own_forward(family):
    """The trainer's log-probs are the model's: a windowed model keeps the padded batch (the shared-prompt
    and tree layouts build masks without windows), and the head's output gets the family's logit
    transform (Gemma's soft cap, Granite's logits_scaling)."""
    from aioareal.models.ops import ATTENTION

    model = family_model(family)
    model.config._attn_implementation = ATTENTION  # as models load for training
    # Every sample computed: the groups carry no advantages, which would set them aside.
    config = load_config(overrides=["algo.batch_groups=2", "algo.group_size=2", "train.skip_zero_advantage=false"])
    trainer = Trainer(model, config.algo, config.train, pad_id=0)
    assert trainer.layouts.share == (family not in WINDOWED)  # the windowed ones keep the padded batch
    groups = shared_prompt_groups()
    reference = torch.cat([reference_logprobs(model, s.prompt_ids, s.completion.tokens)
                           for g in groups for s in g.samples])
    with torch.no_grad():
        ours = torch.cat([trainer._logprobs(model, mb)[0][mb.loss_mask.bool()]
                          for part in trainer.pack(groups) for mb in part])
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


def test_the_startup_check_catches_a_broken_family_layer_and_auto_falls_back(monkeypatch):
    """A deliberately wrong layer of the family decoder (family_forward.py, Gemma 2 here: soft caps,
    local and global layers): the start-up check sees it, `engine` is refused, `auto` falls back."""
    model = family_model("gemma2")
    options = EngineOptions(num_slots=2, max_len=32, params=SamplingParams(max_new_tokens=8), fuse=False)
    prompt = [5, 17, 42, 9, 77, 31]
    assert startup_gap(Engine(model, [], options), model, prompt) <= gap_bound(torch.float32)
    rest = FamilyForward._plan_rest
    monkeypatch.setattr(FamilyForward, "_plan_rest", lambda self, *args: 1.5 * rest(self, *args))
    assert startup_gap(Engine(model, [], options), model, prompt) > gap_bound(torch.float32)
    with pytest.raises(UserError, match="model_type gemma2: the engine's log-probs differ"):
        checked(Engine(model, [], options), model, prompt, "engine", lambda: HFEngine(model, [], options), print)
    lines: list[str] = []
    backend = checked(Engine(model, [], options), model, prompt, "auto", lambda: HFEngine(model, [], options),
                      lines.append)
    assert isinstance(backend, HFEngine) and len(lines) == 1 and "start-up check" in lines[0]


def prefixed_groups(prefix: list[int], sizes: list[int], seed: int = 0) -> list[Group]:
    """Groups whose prompts start with `prefix` (then 1 to 6 random ids), and a last one that does not."""
    gen = torch.Generator().manual_seed(seed)
    groups = [Group(gid, prefix + torch.randint(4, 100, (int(torch.randint(1, 7, (1,), generator=gen)),),
                                                generator=gen).tolist(), size=size) for gid, size in enumerate(sizes)]
    return groups + [Group(len(sizes), [5, 6, 7], size=1)]


@pytest.mark.parametrize("family", ["llama", "qwen2-window", "gemma2", "gemma3"])
def test_a_shared_prompt_prefix_is_computed_once_and_changes_no_logprob(family):
    """EngineOptions.prompt_prefix: prompts that start with it prefill only their rest, over the
    prefix's K/V computed once per version (the prefix is longer than the window, so windowed layers
    see across its end); the log-probs are the model's own, before and after a weight update."""
    model = family_model(family)
    before = copy.deepcopy(model)
    prefix = torch.randint(4, 100, (7,), generator=torch.Generator().manual_seed(3)).tolist()
    engine = engine_for(model, prompt_prefix=tuple(prefix))
    starts: list[int] = []
    place = engine._place_prefix
    engine._place_prefix = lambda prompts, slots: starts.append(place(prompts, slots)) or starts[-1]
    results = generate(engine, prefixed_groups(prefix, [2, 3, 1, 2, 3]), new_weights_after(4))
    assert 7 in starts and 0 in starts  # the prefix served the prefixed groups; the last was prefilled whole
    assert {v for r in results for c in r.completions for v in c.versions} == {0, 1}
    assert_matches_reference(results, {0: before, 1: model})
