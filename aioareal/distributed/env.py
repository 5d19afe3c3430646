"""Whether torchrun started this process (its variables, read without importing torch)."""
from __future__ import annotations

import os

from ..errors import UserError

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARS)


def rank_number(name: str) -> int:
    """torchrun's integer variable `name` (RANK, WORLD_SIZE, LOCAL_RANK), or one line saying what it holds."""
    text = os.environ.get(name, "")
    if not text.strip().isdigit():
        raise UserError(f"environment variable {name}={text[:40]!r}: expected a non-negative integer (torchrun sets "
                        "it; unset RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT to run one process)")
    return int(text)
