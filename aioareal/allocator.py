"""Which C allocator serves the process's CPU tensors (run.allocator).

torch allocates every CPU tensor with malloc. glibc's malloc serves a block of up to 32 MiB from
heaps it rarely shrinks once its adaptive mmap threshold has risen, and each new block above it
from fresh pages, faulted in one by one: a training step's activations (tens of MiB per layer,
freed and made again every micro-batch) both fragment the heaps and pay the faults. tcmalloc and
jemalloc keep freed blocks in size-classed caches and reuse them, which made SmolLM2's sums
config faster and smaller (docs/log/figures-from-code.md).

An allocator has to be in the process before anything allocates, so `python -m aioareal` starts
itself again with it in LD_PRELOAD (`reexec`), once, before any model loads. `auto` takes
tcmalloc, else jemalloc, where the system has one (`apt install libtcmalloc-minimal4` or
`libjemalloc2`), and glibc otherwise; naming one that is not installed is an error.
"""
from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import NoReturn

from .errors import UserError

# The shared-library names each allocator goes by (ctypes.util.find_library's spelling), best first.
LIBRARIES = {"tcmalloc": ("tcmalloc_minimal", "tcmalloc"), "jemalloc": ("jemalloc",)}
PACKAGES = {"tcmalloc": "libtcmalloc-minimal4 (Debian/Ubuntu), gperftools-libs (Fedora)",
            "jemalloc": "libjemalloc2 (Debian/Ubuntu), jemalloc (Fedora)"}
MARK = "AIOAREAL_ALLOCATOR"  # set in the restarted process: which allocator it runs with
BEFORE = "AIOAREAL_LD_PRELOAD_BEFORE"  # the LD_PRELOAD the user had, given back to child processes


def library(name: str, find: Callable[[str], str | None] = ctypes.util.find_library) -> str | None:
    """The soname of allocator `name` on this system (what LD_PRELOAD takes), or None."""
    for lib in LIBRARIES[name]:
        found = find(lib)
        if found:
            return found
    return None


def choose(setting: str, find: Callable[[str], str | None] = ctypes.util.find_library) -> tuple[str, str | None]:
    """(the allocator run.allocator asks for, its soname or None for glibc's malloc)."""
    if setting == "system":
        return "system", None
    if setting == "auto":
        for name in LIBRARIES:
            found = library(name, find)
            if found:
                return name, found
        return "system", None
    found = library(setting, find)
    if found is None:
        raise UserError(f"run.allocator={setting}, but this system has no {setting} library; install "
                        f"{PACKAGES[setting]}, or set run.allocator=auto or system")
    return setting, found


def restart_env(env: Mapping[str, str], name: str, soname: str) -> dict[str, str]:
    """The environment of the restarted process: `soname` first in LD_PRELOAD, and the marks."""
    out = dict(env)
    out[BEFORE] = env.get("LD_PRELOAD", "")
    out["LD_PRELOAD"] = " ".join(p for p in (soname, out[BEFORE]) if p)
    out[MARK] = name
    return out


def settle(env: MutableMapping[str, str]) -> None:
    """In the restarted process: LD_PRELOAD back to the user's, so that child processes (reward
    workers under their memory cap) start with glibc's malloc as they would have. The loader has
    read LD_PRELOAD already: this process keeps its allocator."""
    if BEFORE in env:
        before = env.pop(BEFORE)
        if before:
            env["LD_PRELOAD"] = before
        else:
            env.pop("LD_PRELOAD", None)


def needs_restart(env: Mapping[str, str]) -> bool:
    """Whether this process has not yet been restarted with its allocator (nor been told to keep one)."""
    return MARK not in env


def reexec(setting: str) -> None:
    """Start `python -m aioareal` again, same arguments, with the allocator `setting` picks, unless
    this process already is that restart or glibc is what it picks. Returns only when it keeps going."""
    if not needs_restart(os.environ):
        settle(os.environ)
        return
    name, soname = choose(setting)
    if soname is None:
        os.environ[MARK] = name
        return
    _exec(restart_env(os.environ, name, soname))


def _exec(env: dict[str, str]) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


# oneDNN keeps up to 1,024 compiled matmul primitives (and their scratch buffers), one per shape;
# a run's micro-batches and decode batches keep making new shapes, and the cache grew a sums run's
# RSS by 0.3-0.4 GiB over its first steps. 128 was no slower there (docs/log/2026-11-memory-4gib.md).
ONEDNN_CACHE = 128


def cap_onednn_cache(env: MutableMapping[str, str]) -> None:
    """oneDNN's primitive cache at ONEDNN_CACHE entries unless the user set it; oneDNN reads the
    variable when it first builds a primitive, so this must run before the first CPU matmul."""
    env.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHE))


def in_use() -> str:
    """The allocator this process runs with, as the restart marked it ('system' when not restarted)."""
    return os.environ.get(MARK, "system")


def note(setting: str) -> str:
    """The line a run prints about its allocator, with what glibc's malloc costs when it fell back
    to it for want of tcmalloc or jemalloc (measured on the SmolLM2 sums run: README, quick start 2)."""
    name = in_use()
    line = f"allocator: {name} (run.allocator={setting})"
    if name == "system" and setting == "auto":
        line += ("; neither tcmalloc nor jemalloc was found: CPU steps take about 1.4x as long and peak memory "
                 f"is higher; install {PACKAGES['tcmalloc']}")
    return line
