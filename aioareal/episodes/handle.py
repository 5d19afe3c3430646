"""What an episode holds: `gen`, its handle on one sample of its group (docs/architecture.md rule 9).

    turn = await gen.turn(stop=["</calc>"])        # the model speaks until EOS, a stop string or its budget
    gen.observe(await gen.call("calculator", expr))  # the world answers: observation tokens, no loss
    return await gen.score(final_answer)           # the task's reward (or return your own number)

Everything lands in the sample's one record (group.py; docs/episodes.md#one-record). One turn at a
time. An episode that stops awaiting a turn leaves the sequence running in the engine; the turn is
recorded when it ends, and the group is handed on only then.

`Codec`: text <-> tokens for episodes, what a model turn says, and how the world's answer is written.

After raw prompts an observation is appended as its text. After chat prompts it is what the chat
template writes after an assistant turn (SENTINEL) for a message of its role: the turn's end, the
message, the next assistant header; an end the model already wrote (EOS) is not written twice. A
template that cannot render the role falls back to "user", then to the raw text (`check` says which).

`TurnQueue`: the turns episodes ask for, on their way to the engine, and the futures the episodes await.

An episode's `turn()` only queues an ask; the engine's driver (episode_worker.py) hands them over
between two steps (`feed`) and resolves the futures of ended turns after each (`resolve`). The first
turns of a group's episodes with the same stops and budget merge into one request: one prefill, as a
plain group's.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..generation.scheduler import StopStrings, TurnRequest
from ..group import MODEL, OBS_LOGPROB, OBS_VERSION, Completion, Group, ToolCall, Turn
from ..models.prompt_encoding import PromptEncoder
from ..models.template_sandbox import apply_template
from ..tools import ERROR_PREFIX, ToolBox

# (text, example) -> (reward, whether its check failed): the task's verdict through the reward service
Scorer = Callable[[str, Any], Awaitable[tuple[float, bool]]]


@dataclass(frozen=True)
class ModelTurn:
    text: str  # what the model wrote this turn (special tokens dropped)
    finish_reason: str  # "stop" (EOS: the model ended its turn), "stop_string" or "length"
    stop: str | None = None  # the stop string it ended at


@dataclass
class EpisodeContext:
    """What every episode of a run shares."""

    queue: TurnQueue
    codec: Codec
    tools: ToolBox
    score: Scorer
    budget: int  # tokens after the prompt an episode may hold, observations included (generation.max_new_tokens)
    max_calls: int = 8  # tool calls an episode may make (tools.max_calls)


class EpisodeGen:
    def __init__(self, group: Group, index: int, ctx: EpisodeContext) -> None:
        self.group, self.index, self.ctx = group, index, ctx
        self.completion: Completion = group.samples[index].completion
        self.asked = False  # has asked for a turn (until then it holds a place among the group's slots)
        self.score_failures = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._turn: ModelTurn | None = None

    @property
    def example(self) -> Any:
        return self.group.example

    @property
    def room(self) -> int:
        """Tokens the episode may still add (model and observation tokens alike)."""
        return self.ctx.budget - len(self.completion.tokens)

    @property
    def chat(self) -> bool:
        """Whether observations are written by the chat template (else appended as their text)."""
        return self.ctx.codec.template is not None

    @property
    def calls_left(self) -> int:
        return self.ctx.max_calls - len(self.completion.tool_calls)

    @property
    def text(self) -> str:
        """Everything after the prompt so far, as text."""
        return self.ctx.codec.decode(self.completion.tokens)

    async def turn(self, stop: Sequence[str] = (), max_tokens: int | None = None) -> ModelTurn:
        """The model's next turn: it samples until EOS, one of `stop`, `max_tokens` or the budget."""
        if not self._idle.is_set():
            raise RuntimeError("one turn at a time: the previous turn of this episode is still running")
        if self.room <= 0:
            self.completion.finish_reason = "length"
            return ModelTurn("", "length")
        start, stops = len(self.completion.tokens), tuple(stop)
        self._idle.clear()
        future = self.ctx.queue.ask(self.group, self.index, stops, max_tokens or 0, first=not self.asked)
        self.asked = True
        future.add_done_callback(lambda f: self._turn_over(f, start, stops))
        await asyncio.shield(future)  # cancelled, the episode stops waiting; the engine finishes the turn
        assert self._turn is not None
        return self._turn

    def _turn_over(self, future: asyncio.Future, start: int, stops: tuple[str, ...]) -> None:
        self._idle.set()
        if future.cancelled() or future.exception() is not None:
            return
        c = self.completion
        text = self.ctx.codec.decode(c.tokens[start:])
        c.turns.append(Turn(MODEL, text, start, len(c.tokens)))
        hit = None
        if c.finish_reason == "stop_string":
            raw = self.ctx.codec.decode_raw(c.tokens[start:])
            hit = next((s for s in stops if s in raw), None)
        self._turn = ModelTurn(text, c.finish_reason, hit)

    def observe(self, text: str, role: str = "tool") -> None:
        """The world's answer as observation tokens (the chat template's message of `role` where the
        prompts use it). Cut at the budget: the episode then ends with finish_reason "length"."""
        if not self._idle.is_set():
            raise RuntimeError("observe between turns: a turn of this episode is still running")
        c, codec = self.completion, self.ctx.codec
        before = codec.decode_raw(c.tokens[-1:]) if c.finish_reason == "stop" else ""
        ids = codec.encode(codec.observation(text, role, before))
        if len(ids) > self.room:
            ids, c.finish_reason = ids[:max(self.room, 0)], "length"
        start = len(c.tokens)
        c.tokens += ids
        c.logprobs += [OBS_LOGPROB] * len(ids)
        c.versions += [OBS_VERSION] * len(ids)
        c.turns.append(Turn(role, text, start, len(c.tokens)))

    async def call(self, tool: str, arg: str) -> str:
        """Tool `tool`'s answer to `arg`, or "error: ..." (timeouts, exceptions, garbage): never raises."""
        if self.calls_left <= 0:
            self.completion.tool_calls.append(ToolCall(tool, 0.0, "limit"))
            return f"{ERROR_PREFIX}the episode's {self.ctx.max_calls} tool calls are used up"
        result = await self.ctx.tools.call(tool, arg)
        self.completion.tool_calls.append(ToolCall(tool, result.seconds, result.error))
        return result.text

    async def score(self, text: str) -> float:
        """The task's reward of `text` as a final answer (a failed check scores 0 and is counted)."""
        reward, failed = await self.ctx.score(text, self.example)
        self.score_failures += failed
        return reward

    async def settle(self) -> None:
        """Wait until no turn of this episode is in the engine."""
        await self._idle.wait()


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


@dataclass
class Ask:
    group: Group
    index: int
    stop: tuple[str, ...]
    max_tokens: int
    future: asyncio.Future
    first: bool  # the episode's first ask (until then it holds a place among its group's)


class TurnQueue:
    def __init__(self, decode_raw: Callable[[list[int]], str]) -> None:
        self.decode_raw = decode_raw
        self.pending: list[Ask] = []
        self.waiting: dict[tuple[int, int], asyncio.Future] = {}  # (id(group), index) -> its turn's future
        self.on_ask: Callable[[Ask], None] = lambda ask: None  # the driver's wake-up: work arrived by itself

    def ask(self, group: Group, index: int, stop: tuple[str, ...], max_tokens: int,
            first: bool = False) -> asyncio.Future:
        """Queue a turn for sample `index` of `group`; the future is done when its turn has ended."""
        ask = Ask(group, index, stop, max_tokens, asyncio.get_running_loop().create_future(), first)
        self.pending.append(ask)
        self.on_ask(ask)
        return ask.future

    @property
    def pending_sequences(self) -> int:
        return len(self.pending)

    def feed(self, submit: Callable[[TurnRequest], None]) -> int:
        """Hand every pending ask to `submit` (the engine's `submit_turn`); returns how many."""
        merged: dict[tuple, TurnRequest] = {}
        requests: list[TurnRequest] = []
        for ask in self.pending:
            self.waiting[(id(ask.group), ask.index)] = ask.future
            fresh = not ask.group.samples[ask.index].completion.tokens
            key = (id(ask.group), ask.stop, ask.max_tokens)
            if fresh and key in merged:
                merged[key].indices.append(ask.index)
                continue
            stop = StopStrings(ask.stop, self.decode_raw) if ask.stop else None
            request = TurnRequest(ask.group, [ask.index], stop, ask.max_tokens)
            requests.append(request)
            if fresh:
                merged[key] = request
        count = len(self.pending)
        self.pending = []
        for request in requests:
            try:
                submit(request)
            except ValueError as e:  # the engine cannot serve it: the episode's `turn()` raises, not hangs
                for index in request.indices:
                    self.waiting.pop((id(request.group), index)).set_exception(RuntimeError(str(e)))
        return count

    def resolve(self, ended: list[tuple[TurnRequest, int]]) -> None:
        """The engine reported these sequences' turns over: wake their episodes."""
        for request, index in ended:
            future = self.waiting.pop((id(request.group), index))
            if not future.done():  # an episode that stopped waiting (cancelled) learns nothing
                future.set_result(None)
