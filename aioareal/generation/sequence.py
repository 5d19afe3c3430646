"""A sequence in the engine: which slot it holds and which sample of which group it fills.

`TurnRequest`, model turns: how the engine serves an episode (docs/architecture.md rule 9).

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

Transfers: what crosses between host and device in an engine step without a host sync: metadata going up
(`upload`), each slot's liveness kept on the device (`SlotLimits`), the sampled tokens coming back
(`StepOutput`).

A copy from pageable memory (`torch.tensor(list, device="cuda")`) makes the host wait behind the
stream's queue; from pinned memory with `non_blocking=True` it is a true asynchronous DMA. Pinned
buffers come from PyTorch's caching host allocator, which records the copy's stream on the block and
hands it out again only after that copy completes, so dropping the tensor right after the call is
safe. A buffer from anywhere else (`cudaHostRegister`, numpy) lacks that guarantee: do not substitute one.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..group import Completion, Group


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
    turn: TurnRequest | None = None  # an episode's turn (`TurnRequest`); None for a plain group's sample
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


def upload(values: list[int] | list[list[int]], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (a list, or equal-length lists) as a tensor on `device`, copied asynchronously to a GPU."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    host = torch.tensor(values, dtype=dtype, pin_memory=True)  # the caching host allocator's block
    return host.to(device, non_blocking=True)


def upload_padded(rows: list[list[int]], device: torch.device, pad: int = 0) -> torch.Tensor:
    """Right-pad token rows to the longest with `pad`: (len(rows), longest) on `device`, uploaded as
    `upload` does (one host tensor, one copy, whatever the number of rows)."""
    width = max(len(r) for r in rows)
    return upload([r + [pad] * (width - len(r)) for r in rows], device)


# -- liveness ----------------------------------------------------------------------------------------
# The device clears `live` by the host's own end rule (EOS where the slot stops on EOS, else its length
# limit), so the next step can launch before the host reads a token (overlap). Limits and EOS flags go
# up at admission, the EOS ids once. `ended` is the rule's one place; it must agree with the host's
# `Scheduler._append` (tests/generation/test_engine_overlap.py).

class SlotLimits:
    """Per-slot length budget and EOS flag on the device: remaining (slots,) int64, tokens a slot
    may still sample; stop_on_eos (slots,) bool."""

    def __init__(self, num_slots: int, eos_ids: list[int], device: torch.device) -> None:
        self.remaining = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.stop_on_eos = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.eos = upload(sorted(set(eos_ids)), device)  # (E,), maybe empty: nothing ends on EOS

    def ended(self, tokens: torch.Tensor, remaining: torch.Tensor, stop_on_eos: torch.Tensor) -> torch.Tensor:
        """tokens (n,) just sampled, remaining (n,) after them -> (n,) bool: the sequence is over.
        A comparison with each EOS id, not `torch.isin`, whose sort a CUDA graph should not capture."""
        is_eos = (tokens[:, None] == self.eos[None, :]).any(dim=-1)
        return (remaining <= 0) | (stop_on_eos & is_eos)

    def start(self, slots: torch.Tensor, first: torch.Tensor, limits: torch.Tensor,
              stop_on_eos: torch.Tensor) -> torch.Tensor:
        """Admission: slots (m,) take their limits and EOS flags; returns their liveness (m,) after
        the first tokens `first` (m,) sampled from the prefill."""
        remaining = limits - 1
        self.remaining[slots] = remaining
        self.stop_on_eos[slots] = stop_on_eos
        return ~self.ended(first, remaining, stop_on_eos)

    def advance(self, live: torch.Tensor, tokens: torch.Tensor, index: slice | torch.Tensor) -> None:
        """A decode step sampled `tokens` for the slots `index`; clear `live` in place where they
        ended. Finished slots' budgets count on: admission resets them."""
        remaining = self.remaining[index] - 1
        self.remaining[index] = remaining
        live[index] = live[index] & ~self.ended(tokens, remaining, self.stop_on_eos[index])


# -- inflight ----------------------------------------------------------------------------------------
# One step's sampled tokens on their way to the host. With overlap the engine reads step t while t+1
# computes, so the output carries its own context: the sequences running at launch (a slot freed since
# may hold another), those it admitted (their first tokens lead), and the version. On CUDA an event
# recorded after the copy to pinned memory marks it done, and `wait` blocks on that alone.

@dataclass(slots=True)
class StepOutput:
    host: torch.Tensor  # (2, len(admitted) + decoded slots) float32 on the host: tokens, logprobs
    event: torch.cuda.Event | None  # the copy's completion, None on the CPU
    admitted: list[Running]  # sequences this step admitted, in the order of their first tokens
    running: list[Running]  # sequences running when the step was launched (admitted ones included)
    version: int  # policy version of the weights that produced these tokens
    decoded: bool  # whether the step decoded (its second part is one column per slot [0, n))

    def wait(self) -> None:
        """Block until the tokens are in host memory: a host sync on this step's copy only."""
        if self.event is not None:
            self.event.synchronize()


def to_host(out: torch.Tensor, stream: torch.cuda.Stream | None) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Start copying `out` (2, m) to the host without waiting; on the CPU return it as it is."""
    if out.device.type != "cuda":
        return out, None
    host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
    host.copy_(out, non_blocking=True)
    event = torch.cuda.Event()
    event.record(stream)
    return host, event
