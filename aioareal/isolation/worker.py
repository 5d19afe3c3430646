"""The entry point of a reward worker process: run `module:function` jobs sent down a pipe. It imports
only the standard library (no torch), so a worker is up fast, plus whatever `preload` costs.

Protocol, one message each way per job: `(fn, args)` (a `Deferred`) down, `("ok", value)` or
`("error", "TypeName: first line")` back; before its first job `("ready", None)`, so the parent tells
a slow start from a slow job. A worker may run under `reward.memory_limit_mb` (RLIMIT_AS, set before
any import): a job past it fails with MemoryError and the pool replaces the worker.

`start_worker`: one reward worker process started in the spawn context, without re-running the parent's main script.

Spawn (not fork: the parent holds CUDA state and threads) re-runs the parent's `__main__` script by
default, which for a user's script would import torch in every worker and, without an
`if __name__ == "__main__":` guard, start the training again. A worker needs none of it, so for our
workers only (a thread-local flag around our own `start`) the main-module entries are dropped from
spawn's preparation data; other users of multiprocessing are untouched.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import spawn
from multiprocessing.connection import Connection
from typing import Any


@dataclass(frozen=True)
class Deferred:
    """A check to run in a worker process: `fn` is 'package.module:function', called as fn(*args)."""
    fn: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Outcome:
    status: str  # "ok", "timeout" or "error"
    value: Any = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


_resolved: dict[str, Callable[..., Any]] = {}


def resolve(spec: str) -> Callable[..., Any]:
    """'package.module:function' (or 'module:object.method') -> the callable, imported once per worker."""
    fn = _resolved.get(spec)
    if fn is None:
        module, _, name = spec.partition(":")
        fn = functools.reduce(getattr, name.split("."), importlib.import_module(module))
        _resolved[spec] = fn
    return fn


def warm(module: str) -> None:
    """A job that only imports `module` (a pool grown a preload after its workers started)."""
    importlib.import_module(module)


def limit_memory(megabytes: int) -> None:
    """Cap this process's address space (RLIMIT_AS) at `megabytes`; 0 (or a platform without it) = no cap."""
    try:
        import resource
    except ImportError:  # not POSIX: no limit to set
        return
    if megabytes <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = megabytes * 1024 * 1024
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def serve(conn: Connection, preload: tuple[str, ...], memory_limit_mb: int = 0) -> None:
    """Answer jobs until the parent closes its end of the pipe (or kills this process)."""
    # Ctrl-C in a terminal signals the whole process group: the parent decides when workers end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setpgid(0, 0)  # a group of its own: what a job starts is killed with this worker (`kill_worker`)
    limit_memory(memory_limit_mb)
    for module in preload:
        importlib.import_module(module)
    conn.send(("ready", None))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        reply = _call(fn, args)
        try:
            conn.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # a result that cannot travel back
            conn.send(("error", f"unpicklable result: {type(e).__name__}: {e}"[:500]))


def _call(fn: str, args: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        value = resolve(fn)(*args)
        return ("ok", value)
    except MemoryError:
        return ("error", "MemoryError: the job ran past the worker's memory limit (reward.memory_limit_mb)")
    except BaseException as e:  # the job failed, not the worker: report it and take the next one
        lines = str(e).strip().splitlines()
        return ("error", f"{type(e).__name__}: {lines[0] if lines else ''}"[:500])


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
