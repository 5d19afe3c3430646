"""Whether torchrun started this process (its variables, read without importing torch)."""
from __future__ import annotations

import os

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARS)
