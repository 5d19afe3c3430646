"""`python -m aioareal chat TARGET [--prompt TEXT] [--max-new-tokens N] [--temperature T]`.

Talks to a run's policy, a checkpoint or a model (targets.py), printing each token as it comes.
Why Hugging Face `generate` with a streamer and not the engine: the engine batches many prompts and
hands back whole completions when they finish (generation/engine.py); one conversation needs one
sequence streamed token by token, which `generate` does correctly out of the box, and a reply's
speed is bounded by the reader, not by batching.

Input: `--prompt TEXT` answers once; piped stdin is one prompt per line (blank lines skipped), or
the whole input as one prompt with `--whole-input`; on a terminal, a prompt per line until an empty
line, `exit` or Ctrl-D (`/reset` forgets the conversation). Lines of one session are turns of one
conversation, through the model's chat template with its history. A model without a chat template
(the tiny model) gets its raw prompt format: each line is a prompt by itself ("23+45="), no history.
Control characters in the reply are escaped: a model can write terminal escape sequences."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import TextStreamer

from ..config import Config
from ..config.limits import check_flag
from ..devices import resolve_device
from ..errors import UserError, guarded, one_line
from ..models.load_policy import eos_token_ids, load_model, load_tokenizer, resolve_dtype
from ..models.prompt_encoding import PromptEncoder
from ..models.template_sandbox import apply_template, template_error
from ..run.warmup import SUMMARY_FILE as WARMUP_SUMMARY
from .eval_command import split_items
from .samples import printable
from .targets import model_source, resolve, target_config

NAMED_MODEL_TOKENS = 256  # the reply limit for a model given by name, with no run config to take it from


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aioareal chat", description="Talk to a trained policy or a model.")
    p.add_argument("items", nargs="+", metavar="TARGET", help="a run dir, a checkpoint dir or a model; "
                   "section.key=value overrides (data.system_prompt=...) may follow")
    p.add_argument("--prompt", help="answer this one prompt and exit")
    p.add_argument("--whole-input", action="store_true", help="piped stdin is one prompt (default: one per line)")
    p.add_argument("--system", help="system message (default: the run's data.system_prompt)")
    p.add_argument("--max-new-tokens", type=int, help="reply limit (default: the run's generation.max_new_tokens; "
                   f"{NAMED_MODEL_TOKENS} for a model given by name)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), else sampled")
    p.add_argument("--config", help="YAML config to take the defaults from (instead of the run's)")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_intermixed_args(argv)
    return guarded(args.debug, lambda: chat(args))


class Printer(TextStreamer):
    """The reply as it comes, to stdout, control characters escaped."""

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        sys.stdout.write(printable(text) + ("\n" if stream_end else ""))
        sys.stdout.flush()


def chat(args: argparse.Namespace) -> int:
    names, overrides = split_items(args.items)
    if len(names) != 1:
        raise UserError(f"chat takes one TARGET, got {len(names)}: {' '.join(names) or '(none)'}")
    check_flags(args.max_new_tokens, args.temperature)
    talk = open_conversation(names[0], overrides, args.config, args.system, args.max_new_tokens, args.temperature)
    for prompt in prompts(args):
        if prompt == "/reset":
            talk.history.clear()
            continue
        if args.prompt is not None:
            talk.reply(prompt)  # one prompt: an error is the command's (exit 2)
            continue
        try:
            talk.reply(prompt)
        except UserError as e:  # one turn's problem (too long): said, and the conversation goes on
            print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
    return 0


def open_conversation(name: str, overrides: list[str], config_file: str | None = None, system: str | None = None,
                      max_new_tokens: int | None = None, temperature: float = 0.0) -> Conversation:
    """A conversation with TARGET `name` (a run, a checkpoint, a model), its model loaded, under the
    run's config (or `config_file`) with `overrides`; `system` replaces data.system_prompt."""
    check_flags(max_new_tokens, temperature)
    target = resolve(name)
    config, start = target_config([target], config_file, overrides)
    source = model_source(target, start)
    device = resolve_device(config.rollout.gen_device, "gen")
    started = time.perf_counter()  # a real model loads for seconds: say so on stderr, not in the reply's stdout
    print(one_line(f"chat: loading {source} on {device} ..."), file=sys.stderr, flush=True)
    tokenizer = load_tokenizer(source, config.model.trust_remote_code)
    model = load_model(source, resolve_dtype(config.model.dtype, device), device, config.model.trust_remote_code,
                       allow_pickle=config.model.allow_pickle).eval()
    print(f"chat: ready in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    limit = max_new_tokens or (NAMED_MODEL_TOKENS if target.named and target.model != "tiny"
                               else config.generation.max_new_tokens)
    chat_format = uses_chat_template(config, bool(target.run_config or config_file), source)
    return Conversation(model, tokenizer, system or config.data.system_prompt, limit, temperature, chat_format)


def check_flags(max_new_tokens: int | None, temperature: float) -> None:
    """The ranges training takes (config/limits.py): a reply of at least one token; a temperature of
    0 (greedy) or one whose logits stay finite (1e-300 overflowed them into a traceback)."""
    if max_new_tokens is not None:
        check_flag("--max-new-tokens", "generation.max_new_tokens", max_new_tokens)
    if temperature != 0:
        check_flag("--temperature", "generation.temperature", temperature, " (or 0: greedy)")


def uses_chat_template(config: Config, from_run: bool, source: str) -> bool:
    """Whether prompts go through the chat template: as the run rendered its prompts (an explicit
    data.chat_template, else the task's choice); a model without a run: its template, unless it is
    the tiny model, whose format is raw ("23+45=")."""
    d = config.data
    if d.chat_template is not None:
        return d.chat_template
    if from_run:
        if d.task == "arithmetic":
            return config.arithmetic.style == "chat"
        return d.task == "gsm8k" or d.prompt_template is None
    return not (Path(source) / WARMUP_SUMMARY).is_file()  # the tiny model: a warm-start directory


def prompts(args: argparse.Namespace) -> Iterator[str]:
    if args.prompt is not None:
        yield args.prompt
        return
    if not sys.stdin.isatty():
        if args.whole_input:
            yield sys.stdin.read().strip()
            return
        yield from (line.rstrip("\n") for line in sys.stdin if line.strip())
        return
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return
        if not line.strip() or line.strip() == "exit":
            return
        yield line


class Conversation:
    """One conversation's history, rendered through the chat template (or the raw format)."""

    def __init__(self, model: Any, tokenizer: Any, system: str | None, max_new_tokens: int,
                 temperature: float, chat: bool = True) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.chat = chat and bool(getattr(tokenizer, "chat_template", None))
        self.system = system
        self.history: list[dict[str, str]] = []
        self.eos = eos_token_ids(model, tokenizer)
        self.encode = PromptEncoder(tokenizer)  # a raw conversation gets the BOS the tokenizer adds

    def render(self, prompt: str) -> str:
        if not self.chat:
            return prompt  # the raw format: the prompt itself, no turns
        system = [{"role": "system", "content": self.system}] if self.system else []
        messages = system + self.history + [{"role": "user", "content": prompt}]
        try:  # the one bounded renderer training and eval use: a template is a program from the model's files
            return apply_template(self.tokenizer, messages, add_generation_prompt=True)
        except Exception as e:
            if isinstance(e, UserError) or not template_error(e):
                raise
            raise UserError(one_line(f"the model's chat template refused the conversation: {type(e).__name__}: "
                                     f"{e}")) from None

    def room(self, prompt_tokens: int) -> int:
        """New tokens the reply may have: max_new_tokens, or fewer where the conversation would run past
        the model's positions (said once a reply); none left is an error, the conversation kept as it was."""
        positions = getattr(self.model.config, "max_position_embeddings", None)
        if not positions or prompt_tokens + self.max_new_tokens <= positions:
            return self.max_new_tokens
        left = positions - prompt_tokens
        what = "the conversation" if self.history else "the prompt"
        if left < 1:
            raise UserError(f"{what} is {prompt_tokens:,} tokens, past the model's {positions:,} positions; "
                            + ("/reset forgets the conversation" if self.history else "give a shorter prompt"))
        print(one_line(f"warning: {what} is {prompt_tokens:,} tokens of the model's {positions:,} positions: this "
                       f"reply is cut at {left} new tokens"), file=sys.stderr, flush=True)
        return left

    def reply(self, prompt: str, stream: bool = True) -> str:
        """The model's answer to `prompt`, streamed to stdout as it comes (`stream`); both turns are
        remembered."""
        ids = torch.tensor([self.encode(self.render(prompt), self.chat)], device=self.model.device)
        room = self.room(ids.shape[1])
        sampled = self.temperature > 0
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=room,
                                      do_sample=sampled, temperature=self.temperature if sampled else None,
                                      top_p=None, top_k=None, eos_token_id=self.eos,
                                      pad_token_id=self.tokenizer.pad_token_id,
                                      streamer=Printer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
                                      if stream else None)
        text = self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        if self.chat:
            self.history += [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]
        return text
