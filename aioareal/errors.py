"""User-facing errors.

A `UserError` is something the user can fix (a config key, a file, a path). The CLI prints it as
one line and exits with code 2; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import reprlib
import sys
from collections.abc import Callable
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


def guarded(debug: bool, fn: Callable[[], int]) -> int:
    """Run a command: a user error becomes one line on stderr and its exit code (`debug` re-raises
    it with its traceback); a stopped run says how to continue."""
    try:
        return fn()
    except RunStopped as e:  # not an error: the run checkpointed and says how to continue
        print(e, file=sys.stderr)
        return e.exit_code
    except UserError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
