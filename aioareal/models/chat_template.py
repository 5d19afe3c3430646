"""Chat templates rendered under a step bound (docs/reliability.md#bounded-readers): a template is a
Jinja program from a model's files, which the sandbox keeps from Python's internals but not from
looping, so a trace function counts the lines its compiled code ("<template>") runs (counted, not
timed). One huge expression is sized by template_sandbox.py, put in place of transformers' compile
step (transformers' handling of messages, tools and specials is kept). All renders go through
`apply_template`.
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
    """`render()` (a chat template rendered in this thread), stopped with a one-line UserError naming
    `what` past MAX_TEMPLATE_STEPS lines, endless recursion or MAX_RENDER_CHARS characters."""
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
    if isinstance(rendered, str) and len(rendered) > MAX_RENDER_CHARS:
        raise UserError(f"{what} rendered {len(rendered):,} characters for one prompt (at most "
                        f"{MAX_RENDER_CHARS:,}); fix the template, or set data.chat_template=false")
    return rendered


def apply_template(tokenizer: Any, messages: list[dict[str, Any]], **options: Any) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, ...)` bounded. A template's own error
    is raised as it is (`template_error` says which): callers fall back or name the row."""
    what = f"the chat template of {getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}"
    _use_bounded_compile()
    return bounded_render(lambda: tokenizer.apply_chat_template(messages, tokenize=False, **options), what)


def template_error(e: Exception) -> bool:
    """Raised by the chat template (jinja's errors, or its code's: a TypeError, a KeyError), or
    transformers' word on it (a ValueError: no template)."""
    return (type(e).__module__.startswith(("jinja2", "transformers"))
            or isinstance(e, (ValueError, TypeError, KeyError, IndexError, AttributeError)))


def _use_bounded_compile() -> None:
    """Replace transformers' `chat_template_utils._compile_jinja_template`, once per process, by one
    compiling in a bounded twin of the environment transformers configures (taken from an empty
    template: compiling the real one there would fold its constants unguarded)."""
    from transformers.utils import chat_template_utils as utils

    if getattr(utils._compile_jinja_template, "bounded", False):
        return
    configured = utils._compile_jinja_template("").environment

    @functools.lru_cache(maxsize=16)
    def compile_bounded(chat_template: str) -> Any:
        return BoundedEnvironment.twin_of(configured).from_string(chat_template)

    compile_bounded.bounded = True  # type: ignore[attr-defined]
    utils._compile_jinja_template = compile_bounded
