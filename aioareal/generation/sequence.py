"""A sequence in the engine: which slot it holds and which sample of which group it fills."""
from __future__ import annotations

from dataclasses import dataclass

from ..group import Completion, Group
from .turns import TurnRequest


@dataclass(slots=True)
class Running:
    """A sequence occupying a KV-cache slot. The cache holds prompt + tokens[:-1]; tokens[-1] is
    the next input, to be written at position prompt_len + len(tokens) - 1. Right after admission
    the first token is sampled but not yet recorded on the host: it goes to position `context_len`
    (prompt_len, or for an episode's later turn the prompt and its history)."""

    group: Group
    index: int
    slot: int
    completion: Completion
    prompt_len: int = 0
    limit: int = 0  # tokens at which the sequence ends whatever it samples
    stop_on_eos: bool = True  # False under forced lengths
    turn: TurnRequest | None = None  # an episode's turn (turns.py); None for a plain group's sample
    turn_start: int = 0  # tokens the completion held at admission (an episode's history)
    done: bool = False  # ended: a step still in flight (overlap) may hold this sequence; its token is dropped

    @property
    def unit(self) -> Group | TurnRequest:
        """What admitted this sequence: its prefill wrote the slot's prefix (shared with that unit's others)."""
        return self.group if self.turn is None else self.turn

    @property
    def context_len(self) -> int:
        """Tokens prefilled at admission: its first sampled token goes to this position."""
        return self.prompt_len + self.turn_start


class GroupTally:
    """Sequences still running per group: a group is handed back when its last sequence ends."""

    def __init__(self) -> None:
        self.left: dict[int, int] = {}  # group id -> sequences still running

    def start(self, group: Group) -> list[Completion]:
        """A group admitted: its empty completions, one per sample."""
        if group.group_id in self.left:
            raise ValueError(f"group id {group.group_id} is already running")
        self.left[group.group_id] = group.size
        return [s.completion for s in group.start_samples()]

    def end_one(self, group: Group) -> bool:
        """One of `group`'s sequences ended; True when it was the last."""
        self.left[group.group_id] -= 1
        if self.left[group.group_id]:
            return False
        del self.left[group.group_id]
        return True

    def __contains__(self, group_id: int) -> bool:
        return group_id in self.left
