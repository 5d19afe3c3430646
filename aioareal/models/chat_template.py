"""Chat templates rendered under a step bound (docs/reliability.md#bounded-readers).

A chat template is a Jinja program shipped in a model's files. Transformers renders it in Jinja's
immutable sandbox, which stops it from reaching Python's internals but not from looping: nested
loops over `range(100000)` run for hours before training starts. Jinja compiles a template to
Python code (filename "<template>"), so while one renders, a trace function counts the lines that
code executes, and only that code's: past MAX_TEMPLATE_STEPS the render is stopped, and the run
ends with one line naming the template. The bound is counted, not timed, so it is the same on a
fast and a slow machine; real templates take a few hundred steps per prompt, tool schemas
included. One step can still be one huge expression (`n ** (n ** 8)`, `'x' * 10**9`), a filter or
a constant Jinja folds while compiling: the template is compiled and rendered in a sandbox that
sizes those before they run and counts the characters a render makes (template_sandbox.py), put in
place of transformers' own compile step, so transformers' handling of messages, tools and special
tokens is kept and real templates render exactly as transformers renders them. Training, eval,
episodes and chat all render through `apply_template`.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from ..errors import UserError, one_line
from .template_sandbox import BoundedEnvironment, TemplateTooCostly, budget

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
    work = budget().set([0])
    try:
        rendered = render()
    except TemplateTooCostly as e:
        raise UserError(one_line(f"{what} {e} for one prompt; fix the template, or set data.chat_template=false")) \
            from None
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
        budget().reset(work)
    # One expression can build a huge string without running many lines ({{ "x" * 10**9 }}, a join of
    # ranges): the first such prompt ends the run, not every prompt of the data set after it.
    if isinstance(rendered, str) and len(rendered) > MAX_RENDER_CHARS:
        raise UserError(f"{what} rendered {len(rendered):,} characters for one prompt (at most "
                        f"{MAX_RENDER_CHARS:,}); fix the template, or set data.chat_template=false")
    return rendered


def apply_template(tokenizer: Any, messages: list[dict[str, Any]], **options: Any) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, ...)` under `bounded_render`, in the
    bounded sandbox. A template's own error (jinja's raise_exception, a syntax error) is raised as
    it is: callers fall back (episodes) or name the row (`template_error` says which errors)."""
    what = f"the chat template of {getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}"
    _use_bounded_compile()
    return bounded_render(lambda: tokenizer.apply_chat_template(messages, tokenize=False, **options), what)


def template_error(e: Exception) -> bool:
    """Raised by the jinja chat template (TemplateError and its SecurityError, or the template's code
    failing: a TypeError, a KeyError), or transformers' word on it (a ValueError: no template)."""
    return (type(e).__module__.startswith(("jinja2", "transformers"))
            or isinstance(e, (ValueError, TypeError, KeyError, IndexError, AttributeError)))


def _use_bounded_compile() -> None:
    """transformers compiles a template with `chat_template_utils._compile_jinja_template`; ours
    takes the environment transformers configures (options, extensions, filters, globals: from an
    empty template, as compiling the real one there would fold its constants unguarded) and compiles
    the template in a bounded twin of it. Put in place once per process: every render of a chat
    template in aioareal goes through it."""
    from transformers.utils import chat_template_utils as utils

    if getattr(utils._compile_jinja_template, "bounded", False):
        return
    configured = utils._compile_jinja_template("").environment

    @functools.lru_cache(maxsize=16)
    def compile_bounded(chat_template: str) -> Any:
        return BoundedEnvironment.twin_of(configured).from_string(chat_template)

    compile_bounded.bounded = True  # type: ignore[attr-defined]
    utils._compile_jinja_template = compile_bounded
