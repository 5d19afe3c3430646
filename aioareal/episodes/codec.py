"""Text <-> tokens for episodes: what a model turn says, and how the world's answer is written.

After raw prompts an observation is appended as its text. After chat prompts it is what the chat
template writes after an assistant turn (SENTINEL) for a message of its role: the turn's end, the
message, the next assistant header; an end the model already wrote (EOS) is not written twice. A
template that cannot render the role falls back to "user", then to the raw text (`check` says which).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..models.chat_template import apply_template
from ..models.prompt_encoding import PromptEncoder

SENTINEL = "\x00aioareal-turn\x00"


@dataclass
class Codec:
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]  # a turn's text as the episode reads it (special tokens dropped)
    decode_raw: Callable[[list[int]], str]  # special tokens kept: stop strings, the template's overlap
    template: Any | None = None  # the tokenizer, where observations go through its chat template

    def observation(self, text: str, role: str, before: str) -> str:
        """The observation's text to tokenize; `before`: the last model turn's raw text."""
        if self.template is None:
            return text
        framed = self._framed(text, role) or self._framed(text, "user")
        if framed is None:
            return text
        return framed[_overlap(before, framed):]

    def _framed(self, text: str, role: str) -> str | None:
        messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": SENTINEL},
                    {"role": role, "content": text}]
        try:
            rendered = apply_template(self.template, messages, add_generation_prompt=True)  # step-bounded
        except UserError:  # a template that does not end: not a fallback, the run stops
            raise
        except Exception:  # a template that refuses this role (jinja raise_exception): the next fallback
            return None
        at = rendered.find(SENTINEL)
        return None if at < 0 else rendered[at + len(SENTINEL):]

    def check(self, role: str = "tool") -> str:
        """How observations of `role` will be written: "template", "template as user" or "raw"."""
        if self.template is None:
            return "raw"
        if self._framed("1", role) is not None:
            return "template"
        return "template as user" if self._framed("1", "user") is not None else "raw"


def _overlap(before: str, framed: str) -> int:
    """The longest start of `framed` that `before` already ends with (an end-of-turn the model wrote)."""
    for k in range(min(len(before), len(framed)), 0, -1):
        if before.endswith(framed[:k]):
            return k
    return 0


def codec_for(tokenizer: Any, chat: bool) -> Codec:
    """The codec of a run whose prompts use the chat template (`chat`) or not."""
    return Codec(encode=PromptEncoder(tokenizer).continuation,  # observations continue a prompt: no BOS
                 decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                 decode_raw=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
                 template=tokenizer if chat and getattr(tokenizer, "chat_template", None) else None)
