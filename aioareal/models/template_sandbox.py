"""The sandbox chat templates render in: Jinja's immutable sandbox, with every operation that can
make a value much larger than its inputs sized before it runs (docs/reliability.md#bounded-readers),
since one expression is one step of `bounded_render`'s count. A result past MAX_VALUE_CHARS (an
integer past MAX_INT_BITS) is refused before it is made, and all values made count against
MAX_WORK_CHARS per render. Intercepted operators are not folded at compile time. A refusal is a
`TemplateTooCostly` (a BaseException, so neither Jinja nor transformers rewrap it). The environment
is a twin of transformers' own (`twin_of`), so real templates render as there.

Chat templates rendered under a step bound (docs/reliability.md#bounded-readers): a template is a
Jinja program from a model's files, which the sandbox keeps from Python's internals but not from
looping, so a trace function counts the lines its compiled code ("<template>") runs (counted, not
timed). One huge expression is sized by `BoundedEnvironment` above, put in place of transformers' compile
step (transformers' handling of messages, tools and specials is kept). All renders go through
`apply_template`.
"""
from __future__ import annotations

import functools
import re
import string
import sys
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from types import FrameType
from typing import Any, TypeVar

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import UserError, one_line

MAX_VALUE_CHARS = 4_000_000  # one value (a string, a list as text); as MAX_RENDER_CHARS, a rendered prompt
MAX_WORK_CHARS = 64_000_000  # characters made (or weighed) by one render: 16 prompts' worth at the largest
MAX_INT_BITS = 65_536  # an integer of ~20,000 digits; past Python's own 4,300-digit limit for printing one
MAX_JSON_INDENT = 64  # tojson(indent=N): N spaces per level per line, so a large N is a large product
_WORK: ContextVar[list[int] | None] = ContextVar("template_work", default=None)
_FORMAT_NUMBER = re.compile(r"\d+")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


class TemplateTooCostly(BaseException):
    """A template operation refused for its size; the message says which and how large."""


def budget() -> ContextVar[list[int] | None]:
    """The per-render work counter: `bounded_render` (below) sets it to [0] around one render."""
    return _WORK


def weigh(value: Any, cap: int = MAX_VALUE_CHARS) -> int:
    """About how many characters `value` takes as text, counted through containers (a thousand
    references to one string weigh a thousand strings); stops past `cap`. Everything counts at least 1."""
    total, stack = 0, [value]
    while stack and total <= cap:
        x = stack.pop()
        if isinstance(x, (str, bytes)):
            total += max(1, len(x))
        elif isinstance(x, dict):
            total += 2 + 4 * len(x)
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(x)
            stack.extend(x)
        elif isinstance(x, int) and not isinstance(x, bool):
            total += 1 + x.bit_length() // 3
        else:
            total += 16  # None, a float, an Undefined, a namespace: short as text
    return total


def refuse_past(what: str, size: int, limit: int = MAX_VALUE_CHARS, unit: str = "characters") -> None:
    if size > limit:
        raise TemplateTooCostly(f"would make {what} of about {size:,} {unit} (at most {limit:,})")


def count(value: Any) -> Any:
    """`value` (just made by the template), refused past MAX_VALUE_CHARS and counted as work."""
    size = weigh(value)
    refuse_past("a value", size)
    work = _WORK.get()
    if work is not None:
        work[0] += size
        refuse_past("values", work[0], MAX_WORK_CHARS, "characters in one render")
    return value


def _ints(values: Iterable[Any]) -> list[int]:
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _check_ints(args: Iterable[Any]) -> None:
    """A width, a count or an indent past MAX_VALUE_CHARS is a value that size (`'x'.ljust(10**9)`)."""
    for n in _ints(args):
        refuse_past("a value", n)


def _binop_size(op: str, left: Any, right: Any) -> None:
    if op == "**" and _ints([left]) and _ints([right]) and abs(left) > 1 and right > 0:
        refuse_past("a number", left.bit_length() * right, MAX_INT_BITS, "bits")
    elif op == "*" and _ints([left]) and _ints([right]):
        refuse_past("a number", left.bit_length() + right.bit_length(), MAX_INT_BITS, "bits")
    elif op == "*" and (_ints([left]) or _ints([right])):
        times, seq = (left, right) if _ints([left]) else (right, left)
        refuse_past("a value", weigh(seq) * max(times, 0))
    elif op == "%" and isinstance(left, (str, bytes)):
        _percent_size(left, right)


def _percent_size(fmt: str | bytes, args: Any) -> None:
    """`fmt % args`: its text, its arguments, and every width and precision it asks for."""
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else fmt
    values = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, tuple) else [args]
    widths = 0
    for match in _PERCENT_SPEC.finditer(text):
        for part in match.groups():
            widths += int(part) if part and part.isdigit() else 0
    if "*" in text:
        _check_ints(values)
        widths += sum(abs(n) for n in _ints(values))
    refuse_past("a value", len(text) + widths + weigh(values))


def _format_size(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """`fmt.format(*args, **kwargs)`: as `_percent_size`, for format specs (`{:>1000000}`)."""
    widths = 0
    try:
        for _, _, spec, _ in string.Formatter().parse(fmt):
            widths += sum(int(n) for n in _FORMAT_NUMBER.findall(spec or ""))
    except ValueError:
        return  # a malformed format string: str.format refuses it itself
    _check_ints([*args, *kwargs.values()])
    refuse_past("a value", len(fmt) + widths + weigh([args, kwargs]) + sum(abs(n) for n in _ints(args)))


def _growth(name: str, owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """String operations (methods or filters) that can far outgrow their inputs, sized before they run."""
    if name == "replace" and len(args) >= 2 and isinstance(args[0], (str, bytes)):
        old, new = args[0], args[1]
        times = len(owner) + 1 if not old else owner.count(old)
        refuse_past("a value", len(owner) + times * max(0, weigh(new) - len(old)))
    elif name == "join":
        items = list(args[0]) if args and not isinstance(args[0], (str, bytes)) else []
        refuse_past("a value", weigh(items) + len(owner) * len(items))
    elif name in ("expandtabs", "indent"):
        width = next(iter([*args, *kwargs.values()]), 8)  # indent's width may be a string to indent with
        width = len(width) if isinstance(width, (str, bytes)) else width if _ints([width]) else 8
        refuse_past("a value", len(owner) + max(width, 0) * (owner.count("\n" if name == "indent" else "\t") + 1))
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((weigh(v) for v in args[0].values()), default=1)
        refuse_past("a value", len(owner) * longest)
    elif name in ("format", "format_map") and isinstance(owner, str):
        _format_size(owner, args, kwargs if name == "format" else dict(args[0]) if args else {})


def _filter_size(name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if name == "tojson":
        indent = kwargs.get("indent", args[1] if len(args) > 1 else None)
        if isinstance(indent, int) and indent > MAX_JSON_INDENT:
            raise TemplateTooCostly(f"tojson(indent={indent}) is past {MAX_JSON_INDENT}")
    elif name == "format" and isinstance(value, str):
        _percent_size(value, kwargs or args)
    elif name in ("batch", "slice") and args and _ints(args[:1]):
        refuse_past("a value", weigh(value) + 16 * args[0])  # that many lists, however short the value
    elif name == "wordwrap" and isinstance(value, str):
        width = args[0] if args and _ints(args[:1]) else kwargs.get("width", 79)
        wrap = args[2] if len(args) > 2 else kwargs.get("wrapstring") or "\n"
        refuse_past("a value", len(value) + (len(value) // max(int(width), 1) + 1) * weigh(wrap))
    elif name == "join" and not isinstance(value, (str, bytes)):
        sep = args[0] if args and isinstance(args[0], str) else ""
        _growth("join", sep, (value,), {})
    elif isinstance(value, (str, bytes)):
        _growth(name, value, args, kwargs)


def guarded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Filter `fn` sized before it runs and counted after, keeping `fn`'s Jinja attributes."""
    passes = getattr(fn, "jinja_pass_arg", None) is not None

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        rest = args[1:] if passes else args  # past the context or environment Jinja passes first
        value, options = (rest[0], rest[1:]) if rest else (None, ())
        _check_ints([*options, *kwargs.values()])
        refuse_past("a value", weigh(value))  # a filter may turn any value into text
        _filter_size(name, value, options, kwargs)
        return count(fn(*args, **kwargs))

    return run


class BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with `a ~ b` going through the environment's sized join."""

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.join_text((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, sizing what a template makes (see the module's docstring)."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})
    code_generator_class = BoundedCodeGenerator

    @classmethod
    def twin_of(cls, env: ImmutableSandboxedEnvironment) -> BoundedEnvironment:
        """An environment configured as `env` (Jinja's overlay), its filters guarded and `lipsum` (text
        of any length on request) dropped."""
        twin = env.overlay()
        twin.__class__ = cls
        twin.filters = {name: guarded_filter(name, fn) for name, fn in env.filters.items()}
        twin.globals = {name: value for name, value in env.globals.items() if name != "lipsum"}
        twin.finalize = _finalize
        return twin

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _binop_size(operator, left, right)
        return count(super().call_binop(context, operator, left, right))

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _check_ints([*args, *kwargs.values()])
        wrapped = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format to format safely
        owner = getattr(wrapped, "__self__", None)
        if isinstance(owner, (str, bytes)):
            _growth(getattr(wrapped, "__name__", ""), owner, args, kwargs)
        return count(super().call(__context, __obj, *args, **kwargs))

    def join_text(self, parts: tuple[Any, ...]) -> str:
        """`a ~ b`: each part weighed before it is made text (a list prints whole)."""
        for part in parts:
            if not isinstance(part, str):
                refuse_past("a value", weigh(part))
        return self.concat(map(str, parts))

    def concat(self, parts: Iterable[Any]) -> str:  # type: ignore[override]
        """A block's, a macro's or the whole render's output joined, sized as it is gathered."""
        kept, size = [], 0
        for part in parts:
            size += len(part)
            refuse_past("output", size)
            kept.append(part)
        return count("".join(kept))


def _finalize(value: Any) -> Any:
    """What `{{ value }}` prints: a container is printed whole, so it is weighed first."""
    if not isinstance(value, str):
        refuse_past("output", weigh(value))
    return value


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
