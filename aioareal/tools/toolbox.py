"""The tools an episode may call, by name: data in, data out, each call under a timeout.

A tool is `def f(arg) -> str` or `async def f(arg) -> str`, run off the run's event loop (a plain one
on at most `max_threads` daemon threads, an async one on a `ToolLoop`), its timeout enforced from the
run's loop (docs/reliability.md#user-code-deadlines-threads-the-event-loop-and-memory-issue-35-items-2-and-9).
Whatever goes wrong, the episode observes `error: <what>` and the failure is counted. `latency_s`
adds a seeded random sleep before each call: a slow world, for measuring what asynchrony buys. No
tool here runs model-written code (docs/architecture.md rule 9).

`calculate`, the calculator tool: arithmetic a model writes, evaluated by parsing, never by `eval`.

`ast.parse(mode="eval")` only builds a tree, walked with a whitelist (numbers, + - * / // % **, unary
signs); anything else is refused. Work is bounded before anything is computed (MAX_CHARS of text,
MAX_DIGITS per number and intermediate result, a power only when its result would fit), so a call
costs microseconds whatever the model writes. Numbers are exact fractions; a result prints as an
integer or a decimal of up to 12 significant digits.
"""
from __future__ import annotations

import ast
import asyncio
import inspect
import math
import operator
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ..isolation.threads import BoundedThreads, Saturated

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


class ToolThreads:
    """The threads a run's tools may hold, shared by training's box and every evaluation's, so tools
    stuck past their timeout count against one `max_threads` budget."""

    def __init__(self, max_threads: int = 64) -> None:
        self.max_threads = max_threads
        self.threads = BoundedThreads(max_threads, "tool")  # plain tools
        self.stuck_loops: list[ToolLoop] = []  # async tools' loops a tool blocked, until it returns


@dataclass
class ToolBox:
    tools: list[Tool]
    latency_s: tuple[float, float] = (0.0, 0.0)
    seed: int = 0
    max_chars: int = 1000
    stats: ToolStats = field(default_factory=ToolStats)
    max_threads: int = 64  # tools.max_threads (ignored when `shared` is given: its own limit holds)
    shared: ToolThreads | None = None  # the run's threads; None: a pool of this box's own

    def __post_init__(self) -> None:
        self.by_name = {t.name: t for t in self.tools}
        self._rng = random.Random(self.seed)
        if self.shared is None:
            self.shared = ToolThreads(self.max_threads)
        self.max_threads = self.shared.max_threads
        self.threads = self.shared.threads
        self._loop: ToolLoop | None = None  # where async tools run (loop.py), started on the first call
        self._stuck_loops = self.shared.stuck_loops

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
            return await self._on_tool_loop(tool, lambda: tool.fn(arg))
        future = self.threads.submit(lambda: tool.fn(arg))  # Saturated: an error observation
        try:
            value = await asyncio.wrap_future(future)
        except asyncio.CancelledError:  # timed out (or the episode was cancelled): the thread may be stuck
            self.threads.abandon(future)
            raise
        if inspect.isawaitable(value):  # a plain function that returned a coroutine: run it where async tools run
            return await self._on_tool_loop(tool, lambda: value)
        return value

    async def _on_tool_loop(self, tool: Tool, make: Any) -> object:
        loop = self._tool_loop(tool.timeout_s)
        try:
            return await asyncio.wrap_future(loop.submit(make))
        except asyncio.CancelledError:  # timed out: if a tool holds that loop, later calls go to a fresh one
            if loop is self._loop and loop.blocked(tool.timeout_s):
                self._retire_loop()
            raise

    def _tool_loop(self, timeout_s: float) -> ToolLoop:
        """The loop async tools run on (a fresh one once a tool has blocked the last); Saturated when
        `max_threads` retired loops are still held by their tools."""
        if self._loop is not None and self._loop.blocked(timeout_s):
            self._retire_loop()
        if self._loop is None:
            self._stuck_loops[:] = [s for s in self._stuck_loops if s.thread.is_alive()]  # in place: shared
            if len(self._stuck_loops) >= self.max_threads:
                raise Saturated(f"all {self.max_threads} tool loops are held by async tools that block past their "
                                f"timeout")
            self._loop = ToolLoop()
        return self._loop

    def close(self) -> None:
        """Let the async tools' loop end once its calls have (a box made per evaluation leaves no thread)."""
        if self._loop is not None:
            self._loop.retire()
            self._loop = None

    def _retire_loop(self) -> None:
        assert self._loop is not None
        self._loop.retire()
        self._stuck_loops.append(self._loop)
        self._loop = None


# An event loop in a daemon thread of its own, where `async def` tools run, shared by all calls; one
# whose heartbeat stops for much of a call's timeout is retired (why: docs/reliability.md, "Why tools
# and episodes differ").
HEARTBEAT_S = 0.05  # how often the loop says it is alive; a stuck loop is noticed this late at worst


class ToolLoop:
    def __init__(self, name: str = "tool-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._beat = time.monotonic()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def held_for(self) -> float:
        """Seconds since the loop last ran its heartbeat: how long a tool has held it, roughly."""
        return time.monotonic() - self._beat

    def submit(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Future:
        """Run the coroutine `make()` on this loop; cancelling the future cancels it there."""
        async def run() -> Any:
            return await make()
        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def blocked(self, timeout_s: float) -> bool:
        """Whether a tool holds the loop: it has not run its heartbeat for a good part of a call's timeout."""
        return self.held_for() > max(2 * HEARTBEAT_S, timeout_s / 2)

    def retire(self) -> None:
        """Take no more calls; stop once the loop runs again and the calls on it have ended."""
        self.loop.call_soon_threadsafe(self._stop_when_idle)

    def _stop_when_idle(self) -> None:
        if any(not task.done() for task in asyncio.all_tasks(self.loop)):
            self.loop.call_later(HEARTBEAT_S, self._stop_when_idle)
        else:
            self.loop.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _tick(self) -> None:
        self._beat = time.monotonic()
        self.loop.call_later(HEARTBEAT_S, self._tick)


MAX_CHARS = 200  # longer input is refused before it is parsed
MAX_DIGITS = 40  # every operand and intermediate result: |x| < 10**40 (and 1/x too, for non-integers)
MAX_NODES = 64  # operators and numbers in one expression

# Notation models write for the operators Python spells otherwise; thousands separators dropped.
_NORMALISE = {"×": "*", "·": "*", "÷": "/", "^": "**", "−": "-", ",": "", "x": "*"}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class CalculatorError(ValueError):
    """The expression is not plain bounded arithmetic; the message says why (it becomes the observation)."""


def calculate(expression: str) -> str:
    """The value of `expression` as text, e.g. calculate("123*456") == "56088"."""
    text = expression.strip()
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    for old, new in _NORMALISE.items():
        text = text.replace(old, new)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError("not an arithmetic expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES * 2:  # expression, operator and operand nodes
        raise CalculatorError(f"more than {MAX_NODES} operations")
    return _format(_value(tree.body))


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError(f"number over {MAX_DIGITS} digits")
        return _bounded(Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_value(node.left), _value(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if right == 0 and not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            raise CalculatorError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    raise CalculatorError(f"unsupported: {type(node).__name__.lower()} (numbers and + - * / // % ** only)")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """base ** exponent for an integer exponent, refused before computing a result out of bounds."""
    if exponent.denominator != 1:
        raise CalculatorError("only integer exponents")
    n = int(exponent)
    if base == 0:
        if n < 0:
            raise CalculatorError("division by zero")
        return Fraction(0 if n else 1)
    size = max(abs(_log10(base.numerator)), abs(_log10(base.denominator)))
    if abs(n) * size > MAX_DIGITS:
        raise CalculatorError(f"result over {MAX_DIGITS} digits")
    return _bounded(base ** n)


def _log10(n: int) -> float:
    return math.log10(abs(n)) if n else 0.0


def _bounded(x: Fraction) -> Fraction:
    limit = 10 ** MAX_DIGITS
    if abs(x.numerator) >= limit or x.denominator >= limit:
        raise CalculatorError(f"number over {MAX_DIGITS} digits")
    return x


def _format(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    return format(float(x), ".12g")
