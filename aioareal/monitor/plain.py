"""What reaches the terminal without the dashboard: one plain line per step (logs, pipes, TERM=dumb),
the choice between the two, and the number format both use."""
from __future__ import annotations

import math
import os
import sys
from typing import Any, TextIO


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def wants_dashboard(setting: str, stream: TextIO | None = None) -> bool:
    """'on', 'off', or 'auto': on only for an interactive terminal (not a pipe, file or TERM=dumb)."""
    if setting not in ("on", "off", "auto"):
        raise ValueError(f"dashboard setting '{setting}': expected 'on', 'off' or 'auto'")
    if setting != "auto":
        return setting == "on"
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM", "") != "dumb"


def _num(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def plain_line(row: dict[str, Any], steps: int | None = None) -> str:
    """One line per step for logs and pipes; missing, None or NaN fields are left out."""
    step = f"step {row.get('step', 0):>{len(str(steps)) if steps else 4}}" + (f"/{steps}" if steps else "")
    parts = [step, f"t {fmt(_num(row, 'time'), '7.1f')}s"]
    for key, label, spec in (("reward_mean", "reward", ".3f"), ("loss", "loss", "+.4f"), ("kl", "kl", ".4f")):
        if _num(row, key) is not None:
            parts.append(f"{label} {row[key]:{spec}}")
    if _num(row, "staleness_mean") is not None:
        parts.append(f"stale {row['staleness_mean']:.2f}/{fmt(_num(row, 'staleness_max'), '.0f')}")
    for key, label in (("gen_tokens_per_s", "gen"), ("train_tokens_per_s", "train")):
        if _num(row, key) is not None:
            parts.append(f"{label} {row[key]:,.0f} tok/s")
    gen_idle, train_idle = _num(row, "gen_idle_frac"), _num(row, "train_idle_frac")
    if gen_idle is not None or train_idle is not None:
        parts.append(f"idle gen {fmt(gen_idle, '.0%')} train {fmt(train_idle, '.0%')}")
    if _num(row, "turns_mean") is not None:  # episodes
        calls, errors = row.get("tool_calls", 0), row.get("tool_errors", 0)
        parts.append(f"turns {row['turns_mean']:.2f} tools {calls} ({errors} err)")
    if row.get("dropped_stale"):
        parts.append(f"dropped {row['dropped_stale']}")
    if _num(row, "eval_pass_rate") is not None:
        parts.append(f"eval {row['eval_pass_rate']:.3f}")
    return " | ".join(parts)
