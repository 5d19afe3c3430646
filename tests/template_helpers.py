"""A char tokenizer carrying a given chat template: the template-bound tests' subject."""
from __future__ import annotations

from aioareal.models.shapes import build_char_tokenizer


def tokenizer_with(template: str):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    return tokenizer
