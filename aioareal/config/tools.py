"""The `tools` section: what episodes (data.episode) may call, and how long each call may take."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import check, doc


@dataclass
class ToolsConfig:
    """Tools episodes call (data.episode): data in, data out, each call under a timeout."""

    names: list[str] = doc("built-in tools episodes may call: calculator (arithmetic by parsing, bounded)",
                           ["calculator"])
    functions: list[str] = doc("your own tools by import path, 'path/to/tools.py:fn' (async def fn(arg: str) -> str; "
                               "a plain def runs in a thread); the tool's name is the function's", [])
    timeout_s: float = doc("time one tool call may take; past it the episode observes an error (tool_errors)", 5.0)
    max_calls: int = doc("tool calls one episode may make (more are answered with an error)", 8)
    max_threads: int = doc("threads your tools run in (plain and async def alike, each call on one); a call that "
                           "overruns timeout_s keeps its thread until it returns, and while all are held so, calls "
                           "fail at once (tool_errors) instead of starting more", 64)
    latency_ms: list[float] = doc("a simulated slow world: each call first sleeps a seeded random time in [lo, hi] "
                                  "milliseconds (one value: exactly that); empty = none", [])

    def __post_init__(self) -> None:
        check(self.timeout_s > 0, "tools.timeout_s", f"must be > 0, got {self.timeout_s}")
        check(self.max_calls >= 0, "tools.max_calls", f"must be >= 0, got {self.max_calls}")
        check(self.max_threads > 0, "tools.max_threads", f"must be > 0, got {self.max_threads}")
        lat = self.latency_ms
        check(len(lat) <= 2 and all(x >= 0 for x in lat) and (len(lat) < 2 or lat[0] <= lat[1]), "tools.latency_ms",
              f"must be [] or [ms] or [lo, hi] with 0 <= lo <= hi, got {lat}")
