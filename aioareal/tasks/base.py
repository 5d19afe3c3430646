"""The task interface: where examples come from, how one becomes a prompt, how a completion scores.

Built-in tasks (synthetic arithmetic, GSM8K) and users' own tasks go through the same path:
a `Task` yields `Example`s for a training and a held-out split and scores completions; a
`PromptRenderer` turns an example into token ids (chat template or raw template).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import UserError

if TYPE_CHECKING:  # not at run time: reward worker processes import tasks without transformers
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Example:
    uid: str
    prompt: str  # the user message (chat) or the full prompt text (raw)
    answer: str  # reference the verifier compares against
    row: dict[str, Any] = field(default_factory=dict, compare=False)  # original columns, for reward functions


@runtime_checkable
class Task(Protocol):
    name: str
    chat: bool  # default: wrap prompts in the tokenizer's chat template

    def splits(self) -> tuple[list[Example], list[Example]]:
        """(training examples, held-out examples)."""
        ...

    def score(self, completion: str, example: Example) -> float:
        """Reward of one completion in [0, 1]; pure and thread-safe (runs in the reward executor)."""
        ...


class PromptRenderer:
    """Example -> prompt token ids, through the chat template or a raw `{field}` template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat: bool, system_prompt: str | None = None,
                 template: str | None = None) -> None:
        if chat and template is None and not getattr(tokenizer, "chat_template", None):
            raise UserError("data.chat_template is true but the tokenizer has no chat template; "
                            "set data.chat_template=false or data.prompt_template='...{question}...'")
        self.tokenizer, self.chat, self.system_prompt, self.template = tokenizer, chat, system_prompt, template

    def text(self, example: Example) -> str:
        if self.template is not None:
            try:
                return self.template.format(**{"prompt": example.prompt, **example.row})
            except KeyError as e:
                raise UserError(f"data.prompt_template uses field {e} which row {example.uid} lacks "
                                f"(fields: {', '.join(example.row)})") from None
        if not self.chat:
            return example.prompt
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": example.prompt})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def ids(self, example: Example) -> list[int]:
        return self.tokenizer.encode(self.text(example), add_special_tokens=False)
