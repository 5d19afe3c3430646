"""The offline character tokenizer: one token per printable ASCII character, made in code.

It is a real `PreTrainedTokenizerFast` (built with the `tokenizers` library), saved and loaded
with `save_pretrained` / `AutoTokenizer` like any hub tokenizer, and it carries a Qwen-style chat
template, so tasks that use chat prompts run offline on the tiny model unchanged.
"""
from __future__ import annotations

from transformers import PreTrainedTokenizerFast

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
