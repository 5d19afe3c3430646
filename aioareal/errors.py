"""User-facing errors.

A `UserError` is something the user can fix (a config key, a file, a path). The CLI prints it as
one line and exits with code 2; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations


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
