"""One writer per run directory: an OS file lock (flock) on `RUN_LOCK` inside it, held for the run's
life (docs/reliability.md#run-directories).

The kernel drops a flock when its holder's last descriptor closes, a SIGKILL included, so a lock
left by a dead run never blocks: the file stays behind but nobody holds it. The pid written into the
file only names the holder in the error line; it is never trusted to decide anything. The
descriptor is opened close-on-exec, and reward workers are spawned, not forked, so no child keeps
the lock alive after its run has gone. Within one process the lock is counted, not retaken: a
`--resume` owns the directory from its first look at it, and the training it starts takes the
same lock again.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ..errors import UserError
from ..io import open_lock_file

RUN_LOCK = ".lock"

_held: dict[Path, tuple[int, int]] = {}  # resolved run dir -> (descriptor, times taken)


def own_run_dir(run_dir: Path) -> None:
    """Take the run directory's lock (creating the directory), or raise a one-line UserError naming
    it and the pid of the live run that holds it."""
    key = Path(run_dir).resolve()
    if key in _held:
        fd, count = _held[key]
        _held[key] = (fd, count + 1)
        return
    try:
        key.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{run_dir}: cannot create the run directory ({e.strerror})") from None
    fd = open_lock_file(key / RUN_LOCK)  # a planted link, FIFO or folder is refused, never followed
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        os.close(fd)
        raise UserError(f"{run_dir} is in use by another run{holder}; wait for it to end, or choose "
                        "another --run-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = (fd, 1)


def release_run_dir(run_dir: Path) -> None:
    """Give back one taking of the lock; the last one closes the descriptor, which frees it."""
    key = Path(run_dir).resolve()
    if key not in _held:
        return
    fd, count = _held.pop(key)
    if count > 1:
        _held[key] = (fd, count - 1)
    else:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {text})" if text.isdigit() else ""


HUSK_FILES = ("config.yaml", RUN_LOCK, "metrics.jsonl", "samples.jsonl", "eval_samples.jsonl")


def remove_husk(run_dir: Path) -> bool:
    """After a fresh run failed before its first step: remove what its start wrote (config.yaml, the
    lock, empty logs) and the directory if nothing else is in it, so a failed start leaves no run
    behind for `plot`, `eval` or the next `--resume` to trip on. Anything else (a checkpoint, a row
    of metrics, a user's file) keeps the directory as it is. True if the directory went. Called while
    the lock is still held (once), so no other run can take the lock of a file about to go."""
    held = _held.get(Path(run_dir).resolve())
    if held is None or held[1] != 1 or not run_dir.is_dir() or any(run_dir.glob("checkpoints/step-*")):
        return False
    logs = [run_dir / name for name in HUSK_FILES[2:]]
    if any(p.is_file() and p.stat().st_size > 0 for p in logs):
        return False
    for name in HUSK_FILES:
        path = run_dir / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
    for sub in ("checkpoints",):
        with contextlib.suppress(OSError):
            (run_dir / sub).rmdir()  # only if empty
    try:
        run_dir.rmdir()  # only if empty: never a file we did not write
    except OSError:
        return False
    return True
