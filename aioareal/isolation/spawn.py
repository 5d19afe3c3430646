"""Starting one reward worker process: the spawn context, without re-running the parent's main script.

Spawn (not fork: the parent holds CUDA state and threads) re-runs the parent's `__main__` script by
default, which for a user's script would import torch in every worker and, without an
`if __name__ == "__main__":` guard, start the training again. A worker needs none of it, so for our
workers only (a thread-local flag around our own `start`) the main-module entries are dropped from
spawn's preparation data; other users of multiprocessing are untouched.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from multiprocessing import spawn
from multiprocessing.connection import Connection
from typing import Any

from .worker import serve

CONTEXT = multiprocessing.get_context("spawn")
DEFAULT_MEMORY_MB = 4096  # reward.memory_limit_mb's default, also for pools made outside a run
_without_main = threading.local()


def start_worker(preload: tuple[str, ...], memory_limit_mb: int = 0) -> tuple[Any, Connection]:
    """A started (daemonic) worker process and our end of its pipe; `memory_limit_mb`: 0 for no cap."""
    parent, child = CONTEXT.Pipe()
    process = CONTEXT.Process(target=serve, args=(child, preload, memory_limit_mb), name="aioareal-reward",
                              daemon=True)
    _install()
    _without_main.on = True
    try:
        process.start()
    finally:
        _without_main.on = False
    child.close()  # the child holds its end; closing ours lets a dead child read as EOF
    return process, parent


def kill_worker(process: Any) -> None:
    """SIGKILL a worker and every process it started (it leads a process group of its own), so a
    reward function's subprocesses do not hold the run's output pipes open after it. The group is
    killed while a member lives, so its id is still ours."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if process.pid is not None:
            os.killpg(process.pid, signal.SIGKILL)  # after a crash the group lives on in its children
    if process.is_alive():
        process.kill()


def _install() -> None:
    if getattr(spawn.get_preparation_data, "_aioareal", False):
        return
    original = spawn.get_preparation_data

    def preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if getattr(_without_main, "on", False):
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    preparation_data._aioareal = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = preparation_data
