"""The task interface, one path for built-in and users' tasks: a `Task` yields training and held-out
`Example`s and scores completions; a `PromptRenderer` turns an example into token ids.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..config import ArithmeticConfig, DataConfig
from ..errors import ConfigError, UserError, one_line
from ..group import Example
from ..io import loads_bounded
from ..models.prompt_encoding import PromptEncoder

if TYPE_CHECKING:  # not at run time: reward worker processes import tasks without transformers
    from transformers import PreTrainedTokenizerBase


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
        self.encoder = PromptEncoder(tokenizer)
        self._longest: int | None = None

    @property
    def templated(self) -> bool:
        """Whether prompts are rendered through the chat template (a raw template wins over it)."""
        return self.chat and self.template is None

    def text(self, example: Example) -> str:
        if self.template is not None:
            try:  # the template's shape was checked at config time (config/limits.py): fields only
                return self.template.format_map({"prompt": example.prompt, **example.row})
            except KeyError as e:
                raise UserError(f"data.prompt_template uses field {e} which row {example.uid} lacks "
                                f"(fields: {', '.join(map(str, example.row))})") from None
            except (ValueError, TypeError, IndexError) as e:  # a format spec the row's value does not take
                raise UserError(f"data.prompt_template does not format row {example.uid}: {e}") from None
        if example.messages is not None:
            return self._conversation(example)
        if not self.chat:
            return example.prompt
        # A row may bring its own system prompt and tools for the chat template (which may ignore tools).
        system = example.row.get("system") or self.system_prompt
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": example.prompt})
        tools = _row_tools(example)
        extra = {"tools": tools} if tools else {}
        return self._render(messages, example, **extra)

    def _conversation(self, example: Example) -> str:
        if not self.chat or not getattr(self.tokenizer, "chat_template", None):
            raise UserError(f"row {example.uid}: a conversational prompt (a list of messages) needs the chat template; "
                            "unset data.prompt_template and data.chat_template=false")
        messages = list(example.messages or [])
        if self.system_prompt and not (messages and messages[0]["role"] == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        tools = _row_tools(example)
        extra = {"tools": tools} if tools else {}
        return self._render(messages, example, **extra)

    def _render(self, messages: list[dict[str, Any]], example: Example, **extra: Any) -> str:
        # Imported here: reward workers import this module without transformers.
        from ..models.template_sandbox import apply_template, template_error

        try:
            return apply_template(self.tokenizer, messages, add_generation_prompt=True, **extra)
        except Exception as e:
            # A template that refuses a row or is malformed: the model's or the data's fault, one line.
            if isinstance(e, UserError) or not template_error(e):
                raise
            hint = "set data.chat_template=false or data.prompt_template='...{question}...'"
            raise UserError(one_line(f"the tokenizer's chat template refused row {example.uid}: "
                                     f"{type(e).__name__}: {e}; {hint}")) from None

    def ids(self, example: Example) -> list[int]:
        return self.encode(self.text(example))

    def encode(self, text: str) -> list[int]:
        """A prompt text (from `text`) as the model's tokenizer forms it (models/prompt_encoding.py)."""
        return self.encoder.encode(text, self.templated)

    def check(self, example: Example, ids: list[int]) -> str | None:
        """The start-up check: `ids` (the prompt as the run encoded it) against the tokenizer's own
        encoding; one line naming a difference (a missing or doubled BOS), else None."""
        return self.encoder.check(self.text(example), ids, self.templated)

    def most_chars(self, tokens: int) -> int:
        """A text longer than this has more than `tokens` tokens for sure (no token covers more than
        the vocabulary's longest entry, doubled for normalizers that fold two characters into one),
        so a multi-megabyte row is refused before it is tokenized."""
        if self._longest is None:
            self._longest = max((len(t) for t in self.tokenizer.get_vocab()), default=1)
        return tokens * 2 * max(self._longest, 1)


def _row_tools(example: Example) -> list[dict[str, Any]] | None:
    """The row's `tools` column: a list of JSON schemas (or that list as a JSON string); None if absent."""
    tools = example.row.get("tools")
    if not tools:
        return None
    if isinstance(tools, str):
        try:
            tools = loads_bounded(tools)
        except ValueError:
            raise UserError(f"row {example.uid}: its 'tools' column is not JSON (expected a list of tool schemas, e.g. "
                            '[{"type": "function", "function": {"name": "calculator", ...}}])') from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise UserError(f"row {example.uid}: its 'tools' column must be a list of tool schemas (dicts), got "
                        f"{type(tools).__name__}")
    return tools


BUILTIN = ("arithmetic", "gsm8k", "file", "hub")


def base_task(d: DataConfig, a: ArithmeticConfig, timeout_s: float, rewarded: bool) -> Task:
    """The task `data.task` names (rewards.build_task wraps it when `reward.functions` are configured)."""
    if d.task in ("file", "hub"):
        return _custom_task(d, timeout_s, rewarded)
    if d.task == "arithmetic":
        from .arithmetic import ArithmeticTask

        return ArithmeticTask(a.digits, a.ops, d.eval_size, d.shuffle_seed, style=a.style, max_operand=a.max_operand)
    if d.task == "gsm8k":
        from .gsm8k import GSM8KTask

        return GSM8KTask(path=d.path, hub_name=d.hub_name or "openai/gsm8k", hub_config=d.hub_config or "main",
                         split=d.split, eval_split=d.eval_split if d.path is None else None,
                         eval_path=d.eval_path, eval_size=d.eval_size, skip_bad_rows=d.skip_bad_rows,
                         seed=d.shuffle_seed, question_field=d.prompt_field, answer_field=d.answer_field,
                         timeout_s=timeout_s)
    raise ConfigError("data.task", f"unknown task '{d.task}' (built in: {', '.join(BUILTIN)})")


def _custom_task(d: DataConfig, timeout_s: float, rewarded: bool) -> Task:
    """A file or hub task; `rewarded`: reward.functions score it (the rows need no answer then)."""
    from .custom import CustomTask
    from .rows import RowSource

    if d.task == "file":
        if d.path is None:
            raise ConfigError("data.path", "data.task=file reads its rows from data.path (.jsonl/.json/.csv/.parquet)")
        if d.eval_split is not None:
            raise ConfigError("data.eval_split", "applies to data.task=hub; for a file task set data.eval_path")
    elif d.hub_name is None:
        raise ConfigError("data.hub_name", "data.task=hub needs a datasets hub name (and data.hub_config, data.split)")
    elif d.path is not None:
        raise ConfigError("data.path", "is set but data.task=hub; use data.task=file to read a local file")
    source = RowSource(path=d.path if d.task == "file" else None, hub_name=d.hub_name, hub_config=d.hub_config,
                       split=d.split, eval_split=d.eval_split, eval_path=d.eval_path, eval_size=d.eval_size,
                       seed=d.shuffle_seed, skip_bad_rows=d.skip_bad_rows,
                       fields=(d.prompt_field,) if rewarded else (d.prompt_field, d.answer_field))
    return CustomTask(source, name=d.task, prompt_field=d.prompt_field, answer_field=d.answer_field,
                      answer_required=not rewarded, chat=d.prompt_template is None, timeout_s=timeout_s)
