"""User-facing errors.

A `UserError` is something the user can fix (a config key, a file, a path). The CLI prints it as
one line and exits with code 2; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import reprlib
import sys
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SHOWN_CHARS = 200  # an offending value in an error line is cut to this (docs/reliability.md#bounded-readers)
_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxdict, _repr.maxtuple, _repr.maxset = 3, 8, 8, 8, 8
_repr.maxstring = _repr.maxother = _repr.maxlong = SHOWN_CHARS


def shown(value: Any) -> str:
    """`value`'s repr for an error line, at most SHOWN_CHARS long, found without walking all of it
    (a value built from nested aliases stands for millions of items, a data row for megabytes)."""
    text = _repr.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


class UserError(Exception):
    """An error caused by the user's input; printed as one line, exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """A config key is unknown, ill-typed or contradicts another key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"config key '{key}': {message}")


class DataError(UserError):
    """A data file is missing, empty or malformed (the message names file and line)."""


class RunStopped(UserError):
    """A run stopped on request (Ctrl-C, SIGTERM) after checkpointing. It exits 128 + the signal
    number, as a shell expects of a killed job, so a script or a sweep does not carry on as if the
    run had finished."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


def terminal_safe(text: object, keep_newlines: bool = True) -> str:
    """`text` made safe to print: control characters (ANSI/OSC escapes, \\r, \\x00-\\x1f, DEL, the C1
    range, bidirectional overrides) become visible escapes such as \\x1b, so data from a file, a
    model or a config cannot move the cursor, clear the screen or retitle the terminal. Newlines and
    tabs are kept unless `keep_newlines` is false (one-line output: error lines, headers)."""
    kept = "\n\t" if keep_newlines else ""
    return "".join(c if c in kept or _printable(c) else _escape(c) for c in str(text))


def _printable(c: str) -> bool:
    return c.isprintable() and unicodedata.category(c) != "Cf" or c in "\u200d\u00ad"  # ZWJ, soft hyphen


def _escape(c: str) -> str:
    code = ord(c)
    if c in "\n\r\t":
        return repr(c)[1:-1]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


LINE_HEAD, LINE_TAIL = 700, 300  # an error line past their sum keeps its start (what, where) and end (the hint)


def one_line(text: object) -> str:
    """`text` as one terminal-safe line (error messages quote values read from files and configs),
    cut in the middle past LINE_HEAD + LINE_TAIL characters: wherever a message quotes a value whole
    (a sweep file's key, a reward function's exception, a config value), the line stays readable."""
    line = terminal_safe(text, keep_newlines=False)
    if len(line) <= LINE_HEAD + LINE_TAIL + 40:
        return line
    return f"{line[:LINE_HEAD]} ... [{len(line) - LINE_HEAD - LINE_TAIL:,} characters cut] ... {line[-LINE_TAIL:]}"


@contextlib.contextmanager
def reading(path: str | Path, what: str = "") -> Iterator[None]:
    """Parsing a user's file: any failure that is not already a UserError (undecodable bytes, a value
    of the wrong type, nesting too deep, an unreadable file) becomes one DataError naming the file,
    so no malformed file ends in a traceback. `what` says what the file should hold."""
    try:
        yield
    except UserError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, OverflowError,
            OSError) as e:
        expected = f" (expected {what})" if what else ""
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise DataError(f"{path}: unreadable{expected}: {type(e).__name__}: {reason}") from None


def guarded(debug: bool, fn: Callable[[], int]) -> int:
    """Run a command: a user error becomes one line on stderr and its exit code (`debug` re-raises
    it with its traceback); a stopped run says how to continue."""
    try:
        return fn()
    except RunStopped as e:  # not an error: the run checkpointed and says how to continue
        print(one_line(e), file=sys.stderr)
        return e.exit_code
    except UserError as e:
        if debug:
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        if debug or e.filename is None:  # not a file the user named or we were told to write: a bug
            raise
        # The environment, not the code: a run directory that cannot be created or written (no
        # permission, a file in its way), a full disk.
        print(f"error: {one_line(e.filename)}: {one_line(e.strerror or e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
