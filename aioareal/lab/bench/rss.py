"""The process's resident set (RSS) on the CPU, where torch's allocations are not counted: its size
now, and its high-water mark, over the whole life of the process or since a reset.

On Linux: the size now from /proc/self/statm; the high-water mark from VmHWM in /proc/self/status;
writing "5" to /proc/self/clear_refs (Linux >= 4.0) resets that mark to the size now, so a window
can be measured in a long-lived process. `ru_maxrss` is the mark since the process started, which
nothing resets (bench head runs each path in a fresh child for it).

What RSS counts: every resident page of the process, so the weights, the optimizer state, Python,
torch's libraries, and freed memory that the allocator keeps rather than returning it (glibc keeps
small and medium blocks). A high-water mark therefore includes the weights, unlike CUDA's
allocator peaks, and one measured after a hungrier window can find pages already resident.
"""
from __future__ import annotations

import resource
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"
T = TypeVar("T")


def rss_bytes() -> int:
    """The resident set now (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def lifetime_high_water_bytes() -> int:
    """The resident set's high-water mark since the process started (ru_maxrss: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_high_water(path: str = CLEAR_REFS) -> str | None:
    """Reset the high-water mark to the resident set now; returns None when done, else why not."""
    try:
        Path(path).write_text("5")
    except OSError as e:  # not Linux, a kernel before 4.0, or /proc not writable (some sandboxes)
        return f"cannot reset the RSS high-water mark ({path}: {e.strerror or e})"
    return None


def high_water_bytes(path: str = STATUS) -> int | None:
    """VmHWM, the resident set's high-water mark since the last reset; None where it is not reported."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    kib = next((line.split()[1] for line in lines if line.startswith("VmHWM:")), None)
    return None if kib is None else int(kib) * 1024


class HighWaters:
    """Wraps timed calls so each records the high-water mark of its own window: reset before the
    call, VmHWM after it. `why_not` says why there are no figures (None where there are)."""

    def __init__(self) -> None:
        self.marks: dict[str, list[int]] = {}
        self.why_not: str | None = None

    def wrap(self, name: str, fn: Callable[[], T]) -> Callable[[], T]:
        self.marks[name] = []

        def call() -> T:
            self.why_not = reset_high_water() or self.why_not
            out = fn()
            mark = high_water_bytes()
            if mark is None:
                self.why_not = self.why_not or f"no VmHWM line in {STATUS}"
            elif self.why_not is None:
                self.marks[name].append(mark)
            return out
        return call

    def peak(self, name: str, skip: int = 0) -> int | None:
        """The highest mark of `name`'s calls after the first `skip` (the warm-up's); None without figures."""
        marks = self.marks[name][skip:]
        return max(marks) if marks and self.why_not is None else None
