"""Reading a checkpoint's state.json: JSON, never code, and every field of the type the run wrote,
so a hand-edited or corrupted file is one line naming it, never a traceback mid-resume
(docs/reliability.md#bad-input-and-terminal-output)."""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import DataError, reading
from ..io import loads_bounded


def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


STATE_FIELDS: dict[str, Callable[[Any], bool]] = {
    "step": _count, "cursor": _count, "reward_failures": _count,
    "elapsed": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0,
    "ledger": lambda x: isinstance(x, dict) and all(_count(v) for v in x.values()),
    "config_digest": lambda x: isinstance(x, str),
    "ranks": lambda x: isinstance(x, list) and all(isinstance(r, dict) for r in x),
}
REQUIRED = ("step", "cursor", "elapsed")


def read_state_fields(file: Path) -> dict[str, Any]:
    """The fields of a RunState from `file`, each checked for its type; a DataError otherwise."""
    with reading(file, "the JSON object a checkpoint writes"):
        fields = loads_bounded(file.read_text(encoding="utf-8"))
    if not isinstance(fields, dict):
        raise DataError(f"{file}: expected a JSON object, got {type(fields).__name__}")
    unknown = sorted(set(fields) - set(STATE_FIELDS))
    missing = [name for name in REQUIRED if name not in fields]
    if unknown or missing:
        raise DataError(f"{file}: " + (f"unknown fields {unknown}" if unknown else f"missing fields {missing}"))
    for name, ok in STATE_FIELDS.items():
        if name in fields and not ok(fields[name]):
            raise DataError(f"{file}: field '{name}' has the wrong type or sign ({fields[name]!r:.60})")
    return fields
