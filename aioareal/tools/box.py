"""The tools an episode may call, by name: data in, data out, each call under a timeout.

A tool is a function of one string returning a string: `async def f(arg) -> str` (it must await,
not compute: a coroutine that computes holds the event loop, and no timeout can stop it), or a
plain `def f(arg) -> str`, run in a daemon thread so that it cannot block the loop (one that
overruns its timeout is abandoned there, as the reward service does: Python cannot kill a thread).
Whatever goes wrong, the episode gets an observation and the run goes on: a tool that raises, hangs
past `timeout_s`, returns something that is not a string, or is not known gives `error: <what>`,
and the failure is counted (`ToolStats`, and each call's `ToolCall` in the sample's record). A long
answer is cut to `max_chars`. `latency_s` adds a seeded random sleep before every call: a slow world
for measuring what asynchrony buys (it is part of the call's seconds, not of its timeout).

No tool here runs model-written code. One that would must run in a process of its own with no
network, a time and memory limit and a scratch directory, and be off by default (DESIGN rule 9).
"""
from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..rewards.threads import DaemonThreads

ToolFn = Callable[[str], "Awaitable[str] | str"]
ERROR_PREFIX = "error: "


@dataclass(frozen=True)
class Tool:
    name: str
    fn: ToolFn
    timeout_s: float = 5.0
    inline: bool = False  # a plain function whose work is bounded by construction (the calculator): no thread


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the episode observes: the answer, or "error: <what went wrong>"
    error: str | None  # None when the tool answered
    seconds: float  # the call's wall time, the simulated latency included


@dataclass
class ToolStats:
    calls: int = 0
    errors: int = 0  # raised, returned garbage, unknown tool (timeouts not included)
    timeouts: int = 0
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        """Cumulative counters for the metrics row."""
        return {"tool_calls_total": self.calls, "tool_errors_total": self.errors + self.timeouts,
                "tool_timeouts_total": self.timeouts}


@dataclass
class ToolBox:
    tools: list[Tool]
    latency_s: tuple[float, float] = (0.0, 0.0)
    seed: int = 0
    max_chars: int = 1000
    stats: ToolStats = field(default_factory=ToolStats)

    def __post_init__(self) -> None:
        self.by_name = {t.name: t for t in self.tools}
        self._rng = random.Random(self.seed)
        self._threads = DaemonThreads("tool")

    @property
    def names(self) -> list[str]:
        return list(self.by_name)

    async def call(self, name: str, arg: str) -> ToolResult:
        """Call tool `name` on `arg`; never raises (but for cancellation of the calling episode)."""
        start = time.monotonic()
        lo, hi = self.latency_s
        if hi > 0:
            await asyncio.sleep(self._rng.uniform(lo, hi))
        text, error = await self._answer(name, arg)
        seconds = time.monotonic() - start
        self.stats.calls += 1
        self.stats.seconds += seconds
        if error is None:
            return ToolResult(text if len(text) <= self.max_chars else text[:self.max_chars] + "…", None, seconds)
        if error == "timeout":
            self.stats.timeouts += 1
        else:
            self.stats.errors += 1
        return ToolResult(ERROR_PREFIX + text, error, seconds)

    async def _answer(self, name: str, arg: str) -> tuple[str, str | None]:
        """(text, None) for an answer, (message, kind) for a failure."""
        tool = self.by_name.get(name)
        if tool is None:
            return f"unknown tool {name!r} (tools: {', '.join(self.by_name) or 'none'})", "unknown"
        try:
            value = await asyncio.wait_for(self._run(tool, arg), tool.timeout_s)
        except TimeoutError:
            return f"{name} did not answer within {tool.timeout_s}s", "timeout"
        except Exception as e:  # a tool's bug or its refusal of bad input: an observation, not a crash
            message = (str(e).strip().splitlines() or [""])[0]
            return (message or type(e).__name__), "raised"
        if not isinstance(value, str):
            return f"{name} returned {type(value).__name__}, not text", "garbage"
        return value, None

    async def _run(self, tool: Tool, arg: str) -> object:
        if tool.inline:
            return tool.fn(arg)
        if inspect.iscoroutinefunction(tool.fn):
            return await tool.fn(arg)
        value = await asyncio.wrap_future(self._threads.submit(lambda: tool.fn(arg)))
        return await value if inspect.isawaitable(value) else value
