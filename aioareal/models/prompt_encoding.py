"""Prompt text into token ids the way the model's own tokenizer forms them (docs/models.md#prompts).

Many tokenizers put a BOS before every text (Gemma, Llama 3 base), and real weights answer a prompt
without it with garbage. One rule, everywhere:
- a raw prompt gets the ids the tokenizer puts before a text (`special_prefix`), once (not again
  when the text already starts with them);
- a chat-templated prompt is encoded as rendered: the template writes the specials it wants;
- a continuation (an observation, a tool's output, a completion) gets none.
Nothing is added after a prompt: an appended EOS would end it before the model's answer.
"""
from __future__ import annotations

import functools
from typing import Any

PROBE = "a"  # one plain character: every tokenizer encodes it to ordinary ids


def special_prefix(tokenizer: Any) -> list[int]:
    """The ids `tokenizer` puts before every text by itself ([bos] for Gemma, [] for Qwen2 and SmolLM2)."""
    plain = tokenizer.encode(PROBE, add_special_tokens=False)
    full = tokenizer.encode(PROBE, add_special_tokens=True)
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return list(full[:start])
    return []


class PromptEncoder:
    """`encode(text, templated)`: a prompt's ids under the rule above, the prefix probed once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @functools.cached_property
    def prefix(self) -> list[int]:
        """Probed on first use: a renderer that only renders text never encodes."""
        return special_prefix(self.tokenizer)

    def __call__(self, text: str, templated: bool = False) -> list[int]:
        return self.encode(text, templated)

    def encode(self, text: str, templated: bool = False) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if templated or not self.prefix or ids[:len(self.prefix)] == self.prefix:
            return ids
        return self.prefix + ids

    def continuation(self, text: str) -> list[int]:
        """Ids of text that follows others (an observation, a tool's output): no specials added."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def check(self, text: str, ids: list[int], templated: bool) -> str | None:
        """One line naming how `ids` (`text` as the run encoded it) differ from the tokenizer's own
        encoding; None when they agree (the start-up check)."""
        own = self.tokenizer.encode(text, add_special_tokens=not templated)
        if templated and self.prefix and own[:len(self.prefix)] != self.prefix:
            return (f"the chat template renders no {self._names(self.prefix)} at the start, which the tokenizer "
                    "puts before every text by itself; the model may never have seen its prompts begin this way")
        own = self._without_suffix(own) if not templated else own
        if not templated and self.prefix and own[:2 * len(self.prefix)] == self.prefix * 2:
            own = own[len(self.prefix):]  # a text written with its own BOS: the tokenizer doubles it, we do not
        if ids == own:
            return None
        if own[len(self.prefix):] == ids and self.prefix:
            return f"the prompt lacks {self._names(self.prefix)}, which the tokenizer puts before every text"
        if ids[:2 * len(self.prefix)] == self.prefix * 2 and self.prefix:
            return f"the prompt starts with {self._names(self.prefix)} twice"
        at = next((i for i, (a, b) in enumerate(zip(ids, own)) if a != b), min(len(ids), len(own)))
        return (f"the prompt's ids differ from the tokenizer's own encoding at token {at} "
                f"({len(ids)} ids against {len(own)})")

    def _without_suffix(self, own: list[int]) -> list[int]:
        """`own` without what the tokenizer appends to every text (an EOS), which a prompt must not carry."""
        full = self.tokenizer.encode(PROBE, add_special_tokens=True)
        suffix = full[len(self.prefix) + len(self.tokenizer.encode(PROBE, add_special_tokens=False)):]
        return own[:len(own) - len(suffix)] if suffix and own[-len(suffix):] == suffix else own

    def _names(self, ids: list[int]) -> str:
        return " ".join(self.tokenizer.convert_ids_to_tokens(ids))
