"""Whether a model name is a local path, and the error when that path is missing. No torch here: a
fresh run asks this before torch loads (run/early_checks.py), as the loaders do again later."""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError


def is_local_name(name: str) -> bool:
    """Whether `name` is a path (relative, absolute, home or existing), not a hub name (owner/name)."""
    return name.startswith((".", "/", "~")) or Path(name).exists() or name.count("/") > 1


def check_local(name: str) -> None:
    if is_local_name(name) and not Path(name).expanduser().exists():
        raise UserError(f"model.name '{name}': no such file or directory")
