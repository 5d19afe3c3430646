"""What an episode holds: `gen`, its handle on one sample of its group (docs/architecture.md rule 9).

    turn = await gen.turn(stop=["</calc>"])        # the model speaks until EOS, a stop string or its budget
    gen.observe(await gen.call("calculator", expr))  # the world answers: observation tokens, no loss
    return await gen.score(final_answer)           # the task's reward (or return your own number)

Everything lands in the sample's one record (group.py; docs/episodes.md#one-record). One turn at a
time. An episode that stops awaiting a turn leaves the sequence running in the engine; the turn is
recorded when it ends, and the group is handed on only then.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..group import MODEL, OBS_LOGPROB, OBS_VERSION, Completion, Group, ToolCall, Turn
from ..tools import ERROR_PREFIX, ToolBox
from .codec import Codec
from .queue import TurnQueue

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
