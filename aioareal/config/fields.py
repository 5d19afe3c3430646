"""The two helpers every config dataclass uses: a field with help text, and a check that names
the field it rejects."""
from __future__ import annotations

from dataclasses import field

from ..errors import ConfigError


def doc(text: str, default: object) -> object:
    """A dataclass field with help text (printed by `python -m aioareal config --keys`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": text})
    return field(default=default, metadata={"help": text})


def check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)
