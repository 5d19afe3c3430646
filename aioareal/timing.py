"""Seconds spent in named phases (a training step's `advantages`, `update`, ...; the engine's
`prefill`, `decode`, ...), for the `time_<phase>` columns of metrics.jsonl and the dashboard.

On the CPU a phase is timed with `perf_counter`. On CUDA the host only launches work, so host time
says little about a device phase: it is bracketed by two events on the current stream instead, and
the events are read in `take()`, which callers make only after a host sync they make anyway (the
trainer's one `.tolist()` per step, the engine's one read of a step's tokens); events not yet
complete then (an overlapped engine's step in flight) are read by a later `take()`. Timing so adds
no host sync. Phases of host work (bookkeeping) say `host=True` and use `perf_counter` everywhere.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhaseTimer:
    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.enabled = enabled  # off: phases run untimed (engines nobody reads the timings of)
        self.seconds: dict[str, float] = {}
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def __call__(self, name: str, host: bool = False) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self.cuda and not host:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((name, start, end))
            return
        start_s = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start_s)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def take(self) -> dict[str, float]:
        """Seconds per phase since the last `take()`, and start afresh. A device phase whose end
        event has not completed yet is kept for a later `take()` (`query` does not wait): callers
        take() after their own host sync, but an overlapped engine (generation/engine.py) has the
        step it just launched still running then."""
        pending = []
        for name, start, end in self._events:
            if end.query():
                self.add(name, start.elapsed_time(end) / 1000)
            else:
                pending.append((name, start, end))
        self._events = pending
        out, self.seconds = self.seconds, {}
        return out


def merge(into: dict[str, float], more: dict[str, float]) -> None:
    """Add `more`'s seconds to `into`, phase by phase."""
    for name, seconds in more.items():
        into[name] = into.get(name, 0.0) + seconds
