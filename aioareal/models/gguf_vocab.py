"""A Hugging Face tokenizer as GGUF tokenizer metadata (`tokenizer.ggml.*`), as llama.cpp reads it.

Both kinds written are llama.cpp's byte-level BPE (`gpt2`): a byte-level BPE tokenizer (Qwen2,
SmolLM2, Llama 3) with its merges, and a vocabulary of single characters (models/shapes.py) as a BPE
with one inert merge, spelled in the byte alphabet. Every id keeps its token; unused ids get
`[PAD<id>]` placeholders, as llama.cpp's converter writes them; specials are control tokens, other
added tokens user-defined. Sentencepiece vocabularies (Llama 2, Mistral) are refused.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from transformers.convert_slow_tokenizer import bytes_to_unicode

from ..errors import UserError

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # llama.cpp's token types
# The pre-tokenizer split regexes llama.cpp knows by name, recognised in a tokenizer.json.
QWEN2_DIGITS = r"\p{N}"
LLAMA3_DIGITS = r"\p{N}{1,3}"
_BYTES = bytes_to_unicode()
INERT_MERGE = f"{_BYTES[0xF8]} {_BYTES[0xF9]}"


@dataclass
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str  # llama.cpp's pre-tokenizer name (`tokenizer.ggml.pre`)
    special_ids: dict[str, int] = field(default_factory=dict)  # bos / eos / unk / pad -> id
    add_bos: bool = False
    chat_template: str | None = None


def vocab_of(tokenizer: Any, rows: int) -> Vocab:
    """The GGUF vocabulary of `tokenizer` for an embedding of `rows` rows."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    kind = backend["model"]["type"]
    if kind == "BPE" and _byte_level(backend):
        merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"].get("merges", [])]
        spell = _as_is
    elif kind == "WordLevel" and all(len(t) == 1 for t in _plain_tokens(tokenizer)):
        merges, spell = [INERT_MERGE], _byte_spelling
    else:
        style = " (sentencepiece style)" if kind == "BPE" else ""
        raise UserError(f"export: the tokenizer is a {kind} vocabulary{style};"
                        " GGUF export writes byte-level BPE (Qwen2, SmolLM2, Llama 3) and character vocabularies")
    tokens, types = _token_table(tokenizer, rows, spell)
    if merges == [INERT_MERGE]:
        _place_inert_merge(tokens)
    return Vocab(tokens=tokens, types=types, merges=merges, pre=_pre_name(tokenizer, backend, merges),
                 special_ids=_special_ids(tokenizer), add_bos=_adds_bos(tokenizer),
                 chat_template=getattr(tokenizer, "chat_template", None) or None)


def _place_inert_merge(tokens: list[str]) -> None:
    """Give the inert merge (llama.cpp wants merges for a BPE vocabulary) its three tokens in unused
    rows: bytes 0xF8 and 0xF9 never occur in UTF-8 text, so it never fires."""
    free = [i for i, t in enumerate(tokens) if t.startswith("[PAD")]
    if len(free) < 3:
        raise UserError("export: a character vocabulary needs 3 unused embedding rows for GGUF's BPE form; "
                        f"this model has {len(free)}")
    left, right = INERT_MERGE.split(" ")
    for i, token in zip(free[-3:], (left, right, left + right)):
        tokens[i] = token


def write_vocab(writer: Any, vocab: Vocab) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    adders = {"bos": writer.add_bos_token_id, "eos": writer.add_eos_token_id,
              "unk": writer.add_unk_token_id, "pad": writer.add_pad_token_id}
    for name, token_id in vocab.special_ids.items():
        adders[name](token_id)
    writer.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def _byte_level(backend: dict[str, Any]) -> bool:
    return "ByteLevel" in json.dumps(backend.get("pre_tokenizer")) or "ByteLevel" in json.dumps(backend.get("decoder"))


def _plain_tokens(tokenizer: Any) -> list[str]:
    added = set(tokenizer.all_special_tokens) | {t.content for t in tokenizer.added_tokens_decoder.values()}
    return [t for t in tokenizer.get_vocab() if t not in added]


def _as_is(token: str) -> str:
    return token


def _byte_spelling(token: str) -> str:
    return "".join(_BYTES[b] for b in token.encode("utf-8"))


def _token_table(tokenizer: Any, rows: int, spell) -> tuple[list[str], list[int]]:
    """Tokens and their types by id, `rows` of them (unused ids filled with placeholders)."""
    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= rows:
        raise UserError(f"export: the tokenizer has ids up to {max(vocab.values())} but the model's embedding only "
                        f"{rows} rows; the tokenizer does not belong to this model")
    added = {t.content: t for t in tokenizer.added_tokens_decoder.values()}
    special = set(tokenizer.all_special_tokens)
    tokens = [f"[PAD{i}]" for i in range(rows)]
    types = [UNUSED] * rows
    for token, i in vocab.items():
        if token in special or (token in added and added[token].special):
            tokens[i], types[i] = token, CONTROL
        elif token in added:
            tokens[i], types[i] = token, USER_DEFINED
        else:
            tokens[i], types[i] = spell(token), NORMAL
    return tokens, types


def _pre_name(tokenizer: Any, backend: dict[str, Any], merges: list[str]) -> str:
    """llama.cpp's pre-tokenizer name: the model's own GGUF file's (kept by gguf_convert.py), else
    recognised from tokenizer.json's split regexes, else "gpt-2" (llama.cpp refuses "gpt2")."""
    text = json.dumps(backend.get("pre_tokenizer"))
    if merges == [INERT_MERGE]:
        return "default"
    kept = tokenizer.init_kwargs.get("gguf_pre_tokenizer") if hasattr(tokenizer, "init_kwargs") else None
    if isinstance(kept, str) and kept not in ("", "default") and len(kept) <= 64:
        return kept
    if LLAMA3_DIGITS.replace("\\", "\\\\") in text:
        return "llama-bpe"
    if QWEN2_DIGITS.replace("\\", "\\\\") in text and "Split" in text:
        return "qwen2"
    if '"Digits"' in text:
        return "smollm"
    return "gpt-2"


def _special_ids(tokenizer: Any) -> dict[str, int]:
    ids = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id, "unk": tokenizer.unk_token_id,
           "pad": tokenizer.pad_token_id}
    return {name: i for name, i in ids.items() if i is not None}


def _adds_bos(tokenizer: Any) -> bool:
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("a")["input_ids"][:1] == [bos]
