"""Running a group's episodes: G coroutines of one example, each filling its sample (docs/episodes.md).

An episode is an async callable `episode(example, gen) -> float | None` (or a class whose instances
are), returning its reward or None for the task's verdict on its last model turn. Whatever it does
wrong scores 0, is counted (`episode_errors`) and the run goes on: it raises, runs past `timeout_s`,
returns no finite number, holds the event loop too long between two awaits (`timed_steps`), or ends
without a model turn (the sample then gets a one-token turn, so its record holds a model token).
"""
from __future__ import annotations

import asyncio
import inspect
import math
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from ..config import ToolsConfig
from ..errors import UserError, terminal_safe
from ..group import MODEL, Group
from ..tools import ToolBox, ToolThreads, build_toolbox
from ..usercode import resolve_spec
from .handle import Codec, EpisodeContext, EpisodeGen, TurnQueue

Episode = Callable[[Any, EpisodeGen], Awaitable[float | None]]


# -- steps -------------------------------------------------------------------------------------------
# An episode cannot leave the run's loop, so each step (one resumption of its coroutine to its next
# await) is timed, and one past `max_step_s` fails the episode as soon as it yields (`LoopHeld`)
# (why: docs/reliability.md, "Why tools and episodes differ").

MAX_STEP_S = 2.0  # longest an episode may hold the loop between two awaits (our own work per step: milliseconds)


class LoopHeld(Exception):
    """An episode held the event loop longer than its step limit."""


async def timed_steps(awaitable: Awaitable[Any], max_step_s: float = MAX_STEP_S) -> Any:
    """Await `awaitable` (an episode's coroutine), failing it with LoopHeld after a step past `max_step_s`."""
    if not inspect.iscoroutine(awaitable):
        return await awaitable
    return await _Stepped(awaitable, max_step_s)


class _Stepped:
    def __init__(self, coro: Any, max_step_s: float) -> None:
        self.coro, self.max_step_s = coro, max_step_s

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, sent, error = self.coro, None, None
        while True:
            start = time.monotonic()
            try:
                yielded = coro.send(sent) if error is None else coro.throw(error)
            except StopIteration as stop:
                self._check(start)
                return stop.value
            self._check(start)
            try:
                sent, error = (yield yielded), None
            except BaseException as e:  # cancellation (the runner's timeout) and the like: the episode's to handle
                sent, error = None, e

    def _check(self, start: float) -> None:
        held = time.monotonic() - start
        if held > self.max_step_s:
            self.coro.close()
            raise LoopHeld(f"held the event loop for {held:.1f}s in one step (limit {self.max_step_s}s): an async "
                           f"episode must await, not block (time.sleep, a long computation); put blocking work in a "
                           f"tool")


@dataclass
class EpisodeStats:
    episodes: int = 0
    errors: int = 0  # raised, timed out, returned garbage or took no turn (scored 0)

    def metrics(self) -> dict[str, int]:
        return {"episode_errors": self.errors}


class EpisodeRunner:
    def __init__(self, episode: Episode, ctx: EpisodeContext, timeout_s: float = 300.0, name: str = "episode",
                 log: Callable[[str], None] | None = None, max_step_s: float = MAX_STEP_S) -> None:
        self.episode, self.ctx, self.timeout_s, self.name = episode, ctx, timeout_s, name
        self.max_step_s = max_step_s  # longest it may hold the event loop between two awaits (timed_steps above)
        self.stats = EpisodeStats()
        self.log = log or (lambda line: print(terminal_safe(line), file=sys.stderr))  # a traceback: its lines kept
        self._reported = False  # the first failure's traceback is shown; later ones only counted

    async def run_group(self, group: Group) -> tuple[list[float], int]:
        """Run the group's G episodes to their ends; (rewards, failures), the rewards also on the samples."""
        group.start_samples()
        outcomes = await asyncio.gather(*(self._one(EpisodeGen(group, i, self.ctx)) for i in range(group.size)))
        rewards = [r for r, _ in outcomes]
        for sample, reward in zip(group.samples, rewards):
            sample.reward = reward
        return rewards, sum(f for _, f in outcomes)

    async def _one(self, gen: EpisodeGen) -> tuple[float, int]:
        self.stats.episodes += 1
        try:
            value = await asyncio.wait_for(self._reward(gen), self.timeout_s)
            failed = gen.score_failures
        except TimeoutError:
            value, failed = self._failed(gen, f"ran past its timeout of {self.timeout_s}s"), 1
        except _OwnTimeout as e:
            value, failed = self._failed(gen, f"raised {e}", e.__cause__), 1
        except Exception as e:  # the user's code: counted, scored 0, the run goes on
            value, failed = self._failed(gen, f"raised {type(e).__name__}: {e}", e), 1
        await gen.settle()  # a turn it stopped waiting for still writes into its record
        if not any(t.end > t.start for t in gen.completion.turns if t.role == MODEL):
            await self._one_token(gen)
            if not failed:
                value, failed = self._failed(gen, "ended without a model turn"), 1
        gen.completion.text = gen.text
        return value, failed

    async def _reward(self, gen: EpisodeGen) -> float:
        try:
            value = await timed_steps(self.episode(gen.example, gen), self.max_step_s)
        except TimeoutError as e:  # the episode's own (its wait_for): not the runner's timeout
            raise _OwnTimeout(f"{type(e).__name__}: {e}") from e
        if value is None:  # the task's verdict on the last model turn
            last = next((t for t in reversed(gen.completion.turns) if t.role == MODEL), None)
            return await gen.score(last.text if last else "")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TypeError(f"returned {value!r}, expected a finite number (the reward) or None")
        return float(value)

    async def _one_token(self, gen: EpisodeGen) -> None:
        if gen.room <= 0:
            # The last observation gives up its last token for it (staleness reads model tokens only).
            c, keep = gen.completion, gen.ctx.budget - 1
            del c.tokens[keep:], c.logprobs[keep:], c.versions[keep:]
            for t in c.turns:
                t.start, t.end = min(t.start, keep), min(t.end, keep)
        await gen.turn(max_tokens=1)

    def _failed(self, gen: EpisodeGen, what: str, error: BaseException | None = None) -> float:
        self.stats.errors += 1
        if not self._reported:
            self._reported = True
            where = "".join(traceback.format_exception(error)) if error is not None else ""
            self.log(f"{self.name} {what} (scored 0 and counted in episode_errors; only this first failure is "
                     f"shown)\n{where}".rstrip())
        return 0.0


class _OwnTimeout(Exception):
    """A TimeoutError the episode raised itself, told apart from the runner's own timeout."""


def load_episode(spec: str) -> Episode:
    """`data.episode`: a built-in name, or 'path/to/file.py:name' / 'package.module:name'."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    target = resolve_spec(spec, "episode")
    if inspect.isclass(target):
        try:
            target = target()
        except Exception as e:
            raise UserError(f"episode '{spec}': {target.__name__}() raised {type(e).__name__}: {e} (a class "
                            "episode is made once, with no arguments)") from None
    call = getattr(target, "__call__", None)  # noqa: B004 -- a class instance's coroutine method counts too
    if not (inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(call)):
        raise UserError(f"episode '{spec}' is not an async function (async def episode(example, gen) -> float | "
                        f"None), nor a class whose instances are; built in: {', '.join(BUILTIN)}")
    return target


# -- built-in episodes -------------------------------------------------------------------------------
# single_turn   a single completion as an episode: one turn, the task's verdict on it.
# calculator    the model may call a calculator (up to tools.max_calls times); its last turn's text is
#               its answer. After chat prompts a call is `<calc>EXPR</calc>`, answered by a `tool`
#               message; after raw prompts (character tokens) it is compact:
#                   347*582=[347*582]{201954}201954
CALL, END = "<calc>", "</calc>"  # after chat prompts
RAW_CALL, RAW_END = "[", "]"  # after raw prompts
RAW_RESULT = "{{{}}}"  # the result after raw prompts: {201954}


async def single_turn(example: Any, gen: EpisodeGen) -> None:
    await gen.turn()


async def calculator(example: Any, gen: EpisodeGen) -> float:
    start, end = (CALL, END) if gen.chat else (RAW_CALL, RAW_END)
    turn = await gen.turn(stop=[end])
    while turn.stop == end and gen.calls_left > 0:
        result = await gen.call("calculator", call_of(turn.text, start, end))
        gen.observe(result if gen.chat else RAW_RESULT.format(result))
        turn = await gen.turn(stop=[end])
    return await gen.score(turn.text)


def call_of(text: str, start: str = CALL, end: str = END) -> str:
    """The expression of the call a turn ends with: between the last `start` and `end`."""
    body = text[:text.rfind(end)] if end in text else text
    return body[body.rfind(start) + len(start):] if start in body else body


BUILTIN = {"single_turn": single_turn, "calculator": calculator}


@dataclass(frozen=True)
class EpisodeSetup:
    """A run's episodes, set up once: the episode, its codec, the tools and one set of tool threads, from
    which training and held-out evaluation alike build their boxes and runners."""

    spec: str  # data.episode as configured
    episode: Episode
    codec: Codec
    tools: ToolsConfig
    timeout_s: float = 300.0  # data.episode_timeout_s
    seed: int = 0  # run.seed: the tools' simulated latencies draw from it
    log: Callable[[str], None] = print  # where an episode's first failure is shown
    # One per run: training's box and every evaluation's share its threads (ToolThreads).
    tool_threads: ToolThreads = field(init=False)
    eval_log: Callable[[str], None] = field(init=False)  # the run's log, for the first evaluation failure only

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_threads", ToolThreads(self.tools.max_threads))
        shown: list[str] = []

        def first_only(line: str) -> None:  # every evaluation fails alike: one account is enough
            if not shown:
                shown.append(line)
                self.log(line)
        object.__setattr__(self, "eval_log", first_only)

    def toolbox(self, seed_offset: int = 0) -> ToolBox:
        """A box of the configured tools with counters of its own (training and evaluation keep apart)
        and the run's threads."""
        t = self.tools
        return build_toolbox(t.names, t.functions, t.timeout_s, t.latency_ms, self.seed + seed_offset, t.max_threads,
                             self.tool_threads)

    def runner(self, queue: TurnQueue, tools: ToolBox, score: Any, budget: int,
               log: Callable[[str], None] | None = None, name: str | None = None) -> EpisodeRunner:
        ctx = EpisodeContext(queue, self.codec, tools, score, budget, self.tools.max_calls)
        return EpisodeRunner(self.episode, ctx, self.timeout_s, name or f"episode '{self.spec}'", log or self.log)
