"""Model turns: how the engine serves an episode (docs/architecture.md rule 9; episodes/ asks for them).

A `TurnRequest` continues some samples of a group: the prompt and every token so far (the model's
earlier turns and the world's observations, all in the sample's completion) are prefilled, once for
all of `indices` (which hold the same tokens: the first turns of a group share one prefill, as a
plain group does), then each sequence decodes until EOS, one of the `stop` strings, its turn's
`max_tokens`, or the episode's budget (`max_new_tokens` tokens after the prompt, observations
included). The engine appends the turn's tokens, log-probs and versions to the completion itself,
and reports each sequence's end (`Engine.take_turns`); the episode reads `finish_reason`: "stop"
(EOS), "stop_string" or "length".

Pausing frees the slot; the next turn is a new admission that prefills the history again. The
alternative, keeping the slot and its KV cache until the observation arrives, saves that prefill but
holds a slot idle for the whole tool call: at 50-200 ms per call and a few milliseconds per decode
step, dozens of steps in which the slot could have decoded another sequence, and a tool that hangs
would hold it until its timeout. A prefill of a short history costs about one decode step (all its
tokens in one forward), so freeing wins unless histories are long and tools fast. It also keeps the
version rule trivially right: the history is always prefilled by the weights that sample the next
token, which is what the recompute rule (docs/architecture.md rule 3) asks of an interrupted sequence, and a
weight update between two turns needs nothing else. Each model token records the version that
sampled it; observation tokens record none (samples.OBS_VERSION).

Stop strings are found on the host, in bookkeeping: the device cannot see text. Each new token's
check decodes only the turn's last `window` tokens (a stop string of n characters ends within the
last n tokens when every token decodes to at least one character), so it costs the same at any
length. A sequence ended by a stop string is cleared on the device too (`Engine`), whose own
liveness rule knows only EOS and lengths.
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
