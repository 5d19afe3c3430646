"""Model turns: how the engine serves an episode (docs/architecture.md rule 9).

A `TurnRequest` continues samples of a group that hold the same tokens: the prompt and every token so
far (model turns and observations) are prefilled once for all of `indices`, then each sequence decodes
until EOS, a `stop` string, the turn's `max_tokens`, or the episode's budget (`max_new_tokens` after
the prompt, observations included). The engine appends the turn's tokens, log-probs and versions to
the completion and reports each end (`take_turns`); the episode reads `finish_reason`: "stop",
"stop_string" or "length".

Pausing frees the slot, and the next turn prefills the history again under the weights that sample
next, which keeps rule 3 trivially right (why not keep the slot: docs/episodes.md#the-engine-serves-turns).
Observation tokens record no version (group.OBS_VERSION).

Stop strings are found on the host (the device cannot see text), decoding only the turn's last
`window` tokens so the check costs the same at any length; the engine then clears the slot's `live`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..group import Group


@dataclass(frozen=True)
class StopStrings:
    strings: tuple[str, ...]
    decode: Callable[[list[int]], str]  # special tokens kept: a stop string may be one

    @property
    def window(self) -> int:
        return max(map(len, self.strings)) + 1  # +1: a character split over two byte-level tokens

    def hit(self, tokens: list[int], start: int) -> bool:
        """Whether the turn that began at `tokens[start]` now holds a stop string."""
        text = self.decode(tokens[max(start, len(tokens) - self.window):])
        return any(s in text for s in self.strings)


@dataclass(eq=False)
class TurnRequest:
    group: Group
    indices: list[int]  # samples of `group` that take this turn; they hold the same tokens so far
    stop: StopStrings | None = None
    max_tokens: int = 0  # tokens this turn may add at most; 0: as many as the episode's budget allows
    forced_lengths = None  # the scheduler's Group interface: turns always stop on EOS

    @property
    def size(self) -> int:
        return len(self.indices)

    @property
    def group_id(self) -> int:
        return self.group.group_id

    @property
    def history(self) -> list[int]:
        """The tokens after the prompt so far (the same for every index)."""
        return self.group.samples[self.indices[0]].completion.tokens

    @property
    def prompt_ids(self) -> list[int]:
        """What the prefill computes: the prompt and the history."""
        return self.group.prompt_ids + self.history

    def check(self, num_slots: int, max_len: int, max_new_tokens: int) -> None:
        """Whether the engine can serve this turn (ValueError if not)."""
        if self.size > num_slots:
            raise ValueError(f"a turn of {self.size} samples cannot fit in {num_slots} slots")
        history = self.history
        if any(self.group.samples[i].completion.tokens != history for i in self.indices[1:]):
            raise ValueError("the samples of one turn must hold the same tokens (they share its prefill)")
        prompt_len = len(self.group.prompt_ids)
        if prompt_len + len(history) >= min(max_len, prompt_len + max_new_tokens):
            raise ValueError(f"no room for a turn after {len(history)} tokens (the episode's budget is "
                             f"{max_new_tokens} tokens after its prompt)")


@dataclass
class TurnEnds:
    """The sequences whose turns ended since the last `take`, as (request, sample index)."""

    ended: list[tuple[TurnRequest, int]] = field(default_factory=list)

    def take(self) -> list[tuple[TurnRequest, int]]:
        out, self.ended = self.ended, []
        return out
