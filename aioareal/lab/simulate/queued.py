"""The read side of the GenerationWorker contract that every simulated generator shares."""
from __future__ import annotations

from collections.abc import Callable, Sized

from ...group import Group


class QueuedSequences:
    """The read side of the GenerationWorker contract that every simulated generator shares: its
    `waiting` group requests and its `running` sequences."""

    waiting: list[Group]
    running: Sized

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def in_flight(self) -> int:
        return len(self.running)

    def on_work(self, wake: Callable[[], None]) -> None:
        """Work arrives only through `submit`."""
