"""The tools a run may call: built-in ones by name (`tools.names`), users' by import path
(`tools.functions=path/to/tools.py:search`, the tool's name being the function's). Every problem is a
one-line error naming the key and the entry, before any model loads."""
from __future__ import annotations

import inspect

from ..errors import ConfigError, UserError
from ..usercode import resolve_spec
from .toolbox import Tool, ToolBox, ToolThreads, calculate

BUILTIN = {"calculator": calculate}


def check_tool_names(names: list[str]) -> None:
    """Each of `tools.names` is a built-in tool."""
    for name in names:
        if name not in BUILTIN:
            raise ConfigError("tools.names", f"unknown tool {name!r} (built in: {', '.join(BUILTIN)}; your own go "
                                             "in tools.functions as 'path/to/file.py:function')")


def load_tools(names: list[str], functions: list[str], timeout_s: float) -> list[Tool]:
    check_tool_names(names)
    tools = [Tool(name, BUILTIN[name], timeout_s, inline=True) for name in names]  # bounded by construction
    for spec in functions:
        fn = resolve_spec(spec, "tool")
        _check_signature(spec, fn)
        tools.append(Tool(spec.rpartition(":")[2].split(".")[-1], fn, timeout_s))
    seen = [t.name for t in tools]
    twice = sorted({n for n in seen if seen.count(n) > 1})
    if twice:
        raise ConfigError("tools.functions", f"two tools are named {twice[0]!r}; each tool needs its own name")
    return tools


def _check_signature(spec: str, fn: object) -> None:
    if not callable(fn):
        raise UserError(f"tool '{spec}' names a {type(fn).__name__} object, not a function (async def f(arg: str) "
                        "-> str)")
    try:
        inspect.signature(fn).bind("arg")
    except TypeError:
        raise UserError(f"tool '{spec}' has signature {inspect.signature(fn)}, which cannot take one argument "
                        "(async def f(arg: str) -> str)") from None
    except ValueError:  # no signature to read (some builtins): trust it
        pass


def build_toolbox(names: list[str], functions: list[str], timeout_s: float, latency_ms: list[float],
                  seed: int = 0, max_threads: int = 64, shared: ToolThreads | None = None) -> ToolBox:
    """A box of these tools; `shared`: the run's tool threads (one budget for every box of the run)."""
    lo, hi = (latency_ms + latency_ms)[:2] if latency_ms else (0.0, 0.0)
    return ToolBox(load_tools(names, functions, timeout_s), (lo / 1000, hi / 1000), seed, max_threads=max_threads,
                   shared=shared)
