"""The queue side every generation backend shows the orchestrator (engine.py, hf_backend.py): what
waits, what runs, what is free, and how groups and episodes' turns get in. The host state lives in
the backend's `Scheduler` (scheduler.py); this reads and feeds it, the same for both backends."""
from __future__ import annotations

from collections import deque

from ..group import Group
from .sampling import SamplingParams
from .scheduler import Scheduler
from .sequence import Running
from .turns import TurnRequest


class QueueFront:
    sched: Scheduler
    num_slots: int
    max_len: int
    params: SamplingParams

    @property
    def free(self) -> list[int]:
        return self.sched.free

    @property
    def waiting(self) -> deque[Group]:
        return self.sched.waiting

    @property
    def running(self) -> dict[int, Running]:
        return self.sched.running

    @property
    def tokens_generated(self) -> int:
        return self.sched.tokens_generated

    @property
    def decode_tokens(self) -> int:
        return self.sched.decode_tokens

    @property
    def busy(self) -> bool:
        """Work left (a step in flight with no running sequence holds only extra tokens: dropped unread)."""
        return bool(self.waiting or self.running)

    def submit(self, group: Group) -> None:
        """Queue `group`: its `size` completions are sampled into `group.samples` and it comes back
        from a later `step()` when every one has finished."""
        if group.size > self.num_slots:
            raise ValueError(f"a group of {group.size} samples cannot fit in {self.num_slots} slots")
        if len(group.prompt_ids) + self.params.max_new_tokens > self.max_len:
            raise ValueError(f"prompt of {len(group.prompt_ids)} tokens + {self.params.max_new_tokens} new "
                             f"tokens exceeds the engine context of {self.max_len}")
        if group.group_id in self.sched.unfinished or any(g.group_id == group.group_id for g in self.waiting):
            raise ValueError(f"group id {group.group_id} is already in this engine")
        self.waiting.append(group)

    def submit_turn(self, turn: TurnRequest) -> None:
        """Queue an episode's turn (turns.py); `take_turns` reports each of its sequences' end."""
        turn.check(self.num_slots, self.max_len, self.params.max_new_tokens)
        self.waiting.append(turn)

    def take_turns(self) -> list[tuple[TurnRequest, int]]:
        """The (turn, sample index) of every sequence whose turn ended since the last call."""
        return self.sched.turns.take()
