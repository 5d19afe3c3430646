"""Host side of the engine: the queue, which slot holds which sequence, and the bookkeeping of
sampled tokens. The device applies the same end rule on its own (sequence.py SlotLimits); the
host's decision is the one that counts for results (`finish_reason`, when a slot is free).

`QueueFront`, the queue side every generation backend shows the orchestrator (engine.py, backends.py): what
waits, what runs, what is free, and how groups and episodes' turns get in. The host state lives in
the backend's `Scheduler` (above); `QueueFront` reads and feeds it, the same for both backends.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque

from ..group import Group
from .sampling import SamplingParams
from .sequence import GroupTally, Running, StepOutput, StopStrings, TurnEnds, TurnRequest


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
        """An episode's turn takes slots: each sample continues its completion (sequence.py). The
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
        rule as the device's (sequence.py SlotLimits), which has already cleared `live` where this ends."""
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
        """Queue an episode's turn (sequence.py); `take_turns` reports each of its sequences' end."""
        turn.check(self.num_slots, self.max_len, self.params.max_new_tokens)
        self.waiting.append(turn)

    def take_turns(self) -> list[tuple[TurnRequest, int]]:
        """The (turn, sample index) of every sequence whose turn ended since the last call."""
        return self.sched.turns.take()
