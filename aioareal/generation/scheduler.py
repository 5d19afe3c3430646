"""Host side of the engine: the queue, which slot holds which sequence, and the bookkeeping of
sampled tokens. The device applies the same end rule on its own (`SlotLimits`, below); the
host's decision is the one that counts for results (`finish_reason`, when a slot is free).

`QueueFront`, the queue side every generation backend shows the orchestrator (engine.py, backends.py): what
waits, what runs, what is free, and how groups and episodes' turns get in. The host state lives in
the backend's `Scheduler`; `QueueFront` reads and feeds it, the same for both backends.

A sequence in the engine (`Running`): which slot it holds and which sample of which group it fills.

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

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..group import Completion, Group
from .sampling import SamplingParams


# -- sequences, turns and transfers -------------------------------------------------------------------
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


# -- the scheduler: the host side of the engine --------------------------------------------------------
class Scheduler:
    def __init__(self, num_slots: int, eos_ids: list[int], max_len: int, max_new_tokens: int,
                 stop: StopStrings | None = None) -> None:
        self.free: list[int] = list(range(num_slots))  # slots the host knows are free (a min-heap)
        self.waiting: deque[Group | TurnRequest] = deque()
        # Sequences the host has not yet seen finish; with overlap, some may have finished in the
        # step in flight (the device knows, the host learns when it reads that step).
        self.running: dict[int, Running] = {}
        self.unfinished = GroupTally()
        self.eos_set = set(eos_ids)
        self.max_len, self.max_new_tokens = max_len, max_new_tokens
        self.max_pos = 0  # the furthest position the next decode writes at, over running sequences
        self.tokens_generated = 0  # total sampled tokens, for throughput
        # Of those, the ones decode steps sampled (not prefill's first tokens): one counter, so a
        # reader on another thread never sees a step's admissions before its tokens (bench e2e).
        self.decode_tokens = 0
        self.turns = TurnEnds()  # episodes' sequences whose turn ended, for Engine.take_turns
        self.paused: list[int] = []  # slots a stop string ended in the last bookkeeping: the device must clear them
        self.stop = stop  # stop strings of plain groups (an episode's turn brings its own)

    def admit(self) -> tuple[list[Group | TurnRequest], list[Running]]:
        """Host side of admission: waiting groups (and episodes' turns) that fit take slots, oldest first."""
        admitted: list[Running] = []
        groups: list[Group | TurnRequest] = []
        while self.waiting and len(self.free) >= self.waiting[0].size:
            group = self.waiting.popleft()
            groups.append(group)
            if isinstance(group, TurnRequest):
                admitted += self._resume(group)
                continue
            completions = self.unfinished.start(group)
            prompt_len = len(group.prompt_ids)
            # A sequence ends at max_new_tokens, at the context's end, or at its forced length.
            cap = min(self.max_new_tokens, self.max_len - prompt_len)
            forced = group.forced_lengths
            for i, completion in enumerate(completions):
                slot = heapq.heappop(self.free)
                limit = cap if forced is None else min(cap, forced[i])
                admitted.append(Running(group, i, slot, completion, prompt_len, limit, forced is None))
            self.max_pos = max(self.max_pos, prompt_len)  # its first decode writes at prompt_len
        if any(g.size != groups[0].size for g in groups):
            # Units of one size side by side (one prefill each size, `same_size_runs`), `admitted` in
            # the same order: stable sorts, and the first tokens are read back in its order.
            groups.sort(key=lambda g: g.size)
            admitted.sort(key=lambda r: r.unit.size)
        return groups, admitted

    def _resume(self, turn: TurnRequest) -> list[Running]:
        """An episode's turn takes slots: each sample continues its completion (`TurnRequest`, above). The
        episode's budget counts every token after the prompt, observations included."""
        prompt_len = len(turn.group.prompt_ids)
        done = len(turn.history)
        cap = min(self.max_new_tokens, self.max_len - prompt_len)
        limit = cap if not turn.max_tokens else min(cap, done + turn.max_tokens)
        admitted = []
        for i in turn.indices:
            completion = turn.group.samples[i].completion
            completion.finish_reason = ""
            admitted.append(Running(turn.group, i, heapq.heappop(self.free), completion, prompt_len, limit,
                                    True, turn, done))
        self.max_pos = max(self.max_pos, prompt_len + done)
        return admitted

    def bookkeep(self, output: StepOutput, in_flight: StepOutput | None) -> list[Group]:
        """Record a step's tokens on the host; free finished slots. Kept lean: without overlap the
        device idles through it. A sequence that already finished (at its first token, or in the
        step before) is skipped: its token here is a dead slot's extra one."""
        host = output.host
        tokens, logprobs = host[0].long().tolist(), host[1].tolist()  # host memory already: no sync
        finished: list[Group] = []
        version = output.version
        # First tokens of newly admitted sequences come first, then one token per slot [0, n).
        for i, r in enumerate(output.admitted):
            self._append(r, tokens[i], logprobs[i], version, finished)
        max_pos = 0
        if output.decoded:
            offset, before = len(output.admitted), self.tokens_generated
            for r in output.running:
                if not r.done:
                    pos = self._append(r, tokens[offset + r.slot], logprobs[offset + r.slot], version, finished)
                    max_pos = pos if pos > max_pos else max_pos
            self.decode_tokens += self.tokens_generated - before
        if in_flight is not None:
            # The next launch decodes one position further than the step in flight, which also
            # decodes the sequences it admitted (at prompt_len; the next launch at prompt_len + 1).
            max_pos = max([max_pos] + [r.context_len for r in in_flight.admitted]) + 1
        self.max_pos = max_pos
        return finished

    def _append(self, r: Running, token: int, logprob: float, version: int,
                finished: list[Group]) -> int:
        """Record one token; return the sequence's next position, or -1 if it finished. The same
        rule as the device's (`SlotLimits`, above), which has already cleared `live` where this ends."""
        c = r.completion
        c.tokens.append(token)
        c.logprobs.append(logprob)
        c.versions.append(version)
        self.tokens_generated += 1
        length = len(c.tokens)
        if r.stop_on_eos and token in self.eos_set:
            c.finish_reason = "stop"
        elif (stop := self.stop if r.turn is None else r.turn.stop) is not None and stop.hit(c.tokens, r.turn_start):
            c.finish_reason = "stop_string"  # the host's rule alone: the device's live is cleared after
            self.paused.append(r.slot)
        elif length >= r.limit:
            c.finish_reason = "length"
        else:
            return r.prompt_len + length - 1
        r.done = True
        del self.running[r.slot]
        heapq.heappush(self.free, r.slot)
        if r.turn is not None:
            self.turns.ended.append((r.turn, r.index))
        elif self.unfinished.end_one(r.group):
            finished.append(r.group)
        return -1


def same_size_runs(units: list[Group | TurnRequest]) -> list[tuple[list[Group | TurnRequest], int, int]]:
    """Consecutive units of one size, each run with its rows [a, b) among the admitted sequences."""
    runs, row = [], 0
    for size, run in itertools.groupby(units, key=lambda g: g.size):
        part = list(run)
        runs.append((part, row, row + size * len(part)))
        row += size * len(part)
    return runs


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
        """Queue an episode's turn (`TurnRequest`, above); `take_turns` reports each of its sequences' end."""
        turn.check(self.num_slots, self.max_len, self.params.max_new_tokens)
        self.waiting.append(turn)

    def take_turns(self) -> list[tuple[TurnRequest, int]]:
        """The (turn, sample index) of every sequence whose turn ended since the last call."""
        return self.sched.turns.take()
