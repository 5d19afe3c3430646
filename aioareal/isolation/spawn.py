"""Starting one reward worker process: the spawn context, without re-running the parent's main script.

Spawn (not fork: the parent holds CUDA state and threads) starts a fresh interpreter, and by default
re-runs the parent's `__main__` script in it, so that functions defined there can be unpickled. A
reward worker needs none of that: it runs `worker.serve` and imports what its jobs name.
Re-running a user's training script would import torch in every worker and, without an
`if __name__ == "__main__":` guard, start the training again (a TRL user calling `gsm8k_reward`
from a plain script). So, for our workers only (a thread-local flag set around our own `start`),
the main-module entries are dropped from spawn's preparation data; other users of multiprocessing in
the same process are untouched. (`python -m aioareal` and pytest are not re-run anyway: spawn skips
a main module named `*.__main__`.)
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
    """A started worker process (daemonic: multiprocessing ends it at exit) and our end of its pipe;
    `memory_limit_mb` caps its address space (0 = no cap; `worker.limit_memory`)."""
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
    """SIGKILL a worker and every process it started: the worker leads a process group of its own
    (worker.serve), so a reward function's subprocesses go with it at the deadline, rather than
    running on and holding the run's output pipes open after it exits. The group is killed while
    its leader still lives (or, after a crash, while any member does), so its id is still ours."""
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
