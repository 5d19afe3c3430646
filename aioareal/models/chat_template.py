"""Chat templates rendered under a step bound (docs/reliability.md#bounded-readers).

A chat template is a Jinja program shipped in a model's files. Transformers renders it in Jinja's
immutable sandbox, which stops it from reaching Python's internals but not from looping: nested
loops over `range(100000)` run for hours before training starts. Jinja compiles a template to
Python code (filename "<template>"), so while one renders, a trace function counts the lines that
code executes, and only that code's: past MAX_TEMPLATE_STEPS the render is stopped, and the run
ends with one line naming the template. The bound is counted, not timed, so it is the same on a
fast and a slow machine; real templates take a few hundred steps per prompt, tool schemas
included.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from ..errors import UserError

MAX_TEMPLATE_STEPS = 1_000_000  # lines of compiled template code per render (~1 s of Python)
MAX_RENDER_CHARS = 4_000_000  # one rendered prompt: far beyond any context a model takes
TEMPLATE_FILE = "<template>"  # what Jinja names the code it compiles a template to
T = TypeVar("T")


class _OverBudget(BaseException):
    """Raised inside the template's frames; a BaseException, so no `except Exception` in between
    (transformers', Jinja's) mistakes it for the template's own error."""


def bounded_render(render: Callable[[], T], what: str) -> T:
    """`render()` (which renders a chat template in this thread), stopped with a one-line UserError
    naming `what` if the template's code runs more than MAX_TEMPLATE_STEPS lines or recurses
    without end, or renders more than MAX_RENDER_CHARS characters."""
    steps = 0

    def in_template(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal steps
        if event == "line":
            steps += 1
            if steps > MAX_TEMPLATE_STEPS:
                raise _OverBudget
        return in_template

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        return in_template if frame.f_code.co_filename == TEMPLATE_FILE else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        rendered = render()
    except _OverBudget:
        raise UserError(f"{what} ran more than {MAX_TEMPLATE_STEPS:,} steps for one prompt (a loop that does not "
                        "end?); fix the template, or set data.chat_template=false") from None
    except RecursionError:
        raise UserError(f"{what} recursed without end; fix the template, or set data.chat_template=false") from None
    except MemoryError:
        raise UserError(f"{what} ran out of memory rendering one prompt; fix the template, or set "
                        "data.chat_template=false") from None
    finally:
        sys.settrace(previous)
    # One expression can build a huge string without running many lines ({{ "x" * 10**9 }}, a join of
    # ranges): the first such prompt ends the run, not every prompt of the data set after it.
    if isinstance(rendered, str) and len(rendered) > MAX_RENDER_CHARS:
        raise UserError(f"{what} rendered {len(rendered):,} characters for one prompt (at most "
                        f"{MAX_RENDER_CHARS:,}); fix the template, or set data.chat_template=false")
    return rendered


def apply_template(tokenizer: Any, messages: list[dict[str, Any]], **options: Any) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, ...)` under `bounded_render`."""
    what = f"the chat template of {getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}"
    return bounded_render(lambda: tokenizer.apply_chat_template(messages, tokenize=False, **options), what)
