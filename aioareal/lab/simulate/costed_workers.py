"""A generator and a trainer whose every step costs what a profile says, for the real orchestrator
on the virtual clock. They keep the contracts of the real workers (slots, whole groups, per-token
policy versions, adoption only when allowed, one version per train call) and the engine's own
rules: lowest free slot first, one prefill per admitted prompt (whose first token comes with it),
a decode step over the first max-slot+1 slots attending over the longest live context, and a KV
recompute of the running sequences when a version is adopted mid-rollout.

Speed: stepping token by token costs Python work per sequence per step, too slow for thousands of
training steps. `ProfiledGenerator.step` therefore sleeps once through every decode step up to the
next moment the orchestrator must see (a group finished, or a group's worth of slots free), their
durations summed in closed form (decodeplan.py); a new version, or the trainer starting or stopping
on a shared device, cuts that sleep short at the end of the decode step in progress, so adoption
happens between the same two steps as in the engine. Sequences carry only counters; their tokens
and versions are written out when they finish. tests/lab/simulate/test_simulate.py checks this fast path
against one decode step per call.

The read side of the GenerationWorker contract that every simulated generator shares.
"""
from __future__ import annotations

import asyncio
import heapq
import math
import random
from bisect import bisect_right
from collections.abc import Callable, Sized
from dataclasses import dataclass

from ...generation.sampling import SHORT_SPAN, live_decode_pays
from ...generation.scheduler import GroupTally
from ...group import Group
from .contention import Device, Lockstep, sleep_unless
from .cost_profile import Profile
from .decodeplan import Segment, plan_seconds, steps_begun


@dataclass(slots=True)
class _Seq:
    group: Group
    index: int
    slot: int
    prompt_len: int
    target: int  # forced length
    base: int  # tokens so far = generator.steps - base
    first_step: int  # the decode step during whose call it was admitted (its first token's version)
    uid: int  # tells apart the sequences one slot holds over time


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


class ProfiledGenerator(QueuedSequences):
    def __init__(self, profile: Profile, device: Device, trainer: ProfiledTrainer, slots: int,
                 draw: Callable[[random.Random], int], seed: int, recompute_kv: bool = True,
                 single_steps: bool = False) -> None:
        self.p, self.device, self.trainer, self.slots, self.draw = profile, device, trainer, slots, draw
        # The reference path: one decode step per `step` call, as the engine does (the fast path
        # sleeps to the next moment the orchestrator must see; the two agree, tests/lab/simulate/test_simulate.py).
        self.single_steps = single_steps
        self.rng = random.Random(seed)  # the bench's ForcedLengths draws with the same seed, in the same order
        self.recompute_kv = recompute_kv
        self.live_rows = profile.device.startswith("cpu")
        self.version = 0
        self.tokens_generated = 0
        self.phase_seconds: dict[str, float] = {"prefill": 0.0, "decode": 0.0, "adopt": 0.0, "recompute_kv": 0.0}
        self.waiting: list[Group] = []
        self.unfinished = GroupTally()
        self.free = list(range(slots))  # a min-heap, as the engine's
        self.running: dict[int, _Seq] = {}  # slot -> sequence
        self.ends: list[tuple[int, int]] = []  # min-heap: (decode step at which it ends, slot)
        # Max-heaps (keys negated) of (slot, uid, slot) and (prompt_len - base, uid, slot): the
        # highest live slot and the longest context; entries of ended sequences are dropped lazily.
        self.by_slot: list[tuple[int, int, int]] = []
        self.by_reach: list[tuple[int, int, int]] = []
        self.admitted = 0  # sequences so far (their uids)
        self.steps = 0  # decode steps so far
        self.versions = [(0, 0)]  # (first decode step, version) at each adoption
        self.interrupted = 0  # decode sleeps cut short by a new version or a contention change
        self.group_size = slots  # the smallest group submitted: fewer free slots admit nothing
        self.blank: dict[int, tuple[list[int], list[float]]] = {}  # length -> shared placeholder tokens, logprobs

    # -- the GenerationWorker contract -------------------------------------------------------------
    def submit(self, group: Group) -> None:
        group.forced_lengths = [self.draw(self.rng) for _ in range(group.size)]
        self.group_size = min(self.group_size, group.size)
        self.waiting.append(group)
        self.device.set_active("gen", True)

    def free_slots(self) -> int:
        return len(self.free) - sum(g.size for g in self.waiting)

    async def step(self, adopt: bool) -> list[Group]:
        """One engine step (adopt, admit + prefill, decode), extended over the decode steps up to a
        moment the orchestrator must see: a group finished, a group's worth of slots is free, or
        something this worker depends on changed (a new version, the trainer starting or stopping
        on a shared device; the decode step in progress then completes first)."""
        factor = self.device.factor("gen")
        wake = self.device.wake["gen"]
        wake.clear()  # what happened before this call is already seen by it
        setup = self._adopt() if adopt and self.trainer.version > self.version else 0.0
        finished: list[Group] = []
        setup += self._admit(finished)
        plan = self._plan()
        steps = sum(seg.steps for seg in plan)
        loop = asyncio.get_running_loop()
        start = loop.time()
        if await sleep_unless(wake, (setup + plan_seconds(self.p.decode, plan)) * factor):
            steps = steps_begun(self.p.decode, plan, (loop.time() - start) / factor - setup)
            self.interrupted += 1
            end = start + (setup + plan_seconds(self.p.decode, plan, steps)) * factor
            await asyncio.sleep(max(0.0, end - loop.time()))
        self.phase_seconds["decode"] += plan_seconds(self.p.decode, plan, steps) * factor
        self.steps += steps
        self._finish_due(finished)
        if not self.busy:
            self.device.set_active("gen", False)
        return finished

    def _plan(self) -> list[Segment]:
        """Decode segments from now to the first sequence end that completes a group or frees a
        group's worth of slots (nothing the orchestrator could do changes before that)."""
        if not self.running:
            return []
        gone: set[int] = set()  # slots whose sequences end within the plan
        left: dict[int, int] = {}  # id(group) -> its sequences still running in the plan
        free, step, taken, aside, plan = self.free_slots(), self.steps, [], [], []
        while self.ends:
            end = self.ends[0][0]
            # The engine decodes slots [0, highest live]; on the CPU only the running ones where that pays.
            rows, span = self._top(self.by_slot, gone, aside) + 1, self._top(self.by_reach, gone, aside) + step
            plan += self._segments(1 if self.single_steps else end - step, rows, len(self.running) - len(gone), span)
            if self.single_steps:
                break
            step, done = end, False
            while self.ends and self.ends[0][0] == end:
                taken.append(heapq.heappop(self.ends))
                seq = self.running[taken[-1][1]]
                gone.add(seq.slot)
                left[id(seq.group)] = left.get(id(seq.group), self.unfinished.left[seq.group.group_id]) - 1
                done = done or left[id(seq.group)] == 0
                free += 1
            if done or free >= self.group_size:
                break
        for entry in taken:  # planning only looked: the sequences end when the decode steps are done
            heapq.heappush(self.ends, entry)
        for heap, entry in aside:
            heapq.heappush(heap, entry)
        return plan

    def _segments(self, steps: int, rows: int, live: int, span: int) -> list[Segment]:
        """`steps` decode steps from `span` on over slots [0, rows), `live` of them running. A CPU
        engine decodes the live ones alone while that pays (live_decode_pays), which may stop when
        the span grows past SHORT_SPAN: then the segment splits there."""
        if not self.live_rows or not live_decode_pays(live, rows, span):
            return [Segment(steps, rows, span)]
        if live_decode_pays(live, rows, span + steps - 1):
            return [Segment(steps, live, span)]
        short = SHORT_SPAN - span + 1  # steps whose span is still short
        return [Segment(short, live, span), Segment(steps - short, rows, span + short)]

    def _top(self, heap: list[tuple[int, int, int]], gone: set[int], aside: list) -> int:
        """The largest key (negated in the max-heap) among running sequences not in `gone`; entries
        of ended sequences are dropped, those of `gone` ones set `aside` for `_plan` to restore."""
        while True:
            key, uid, slot = heap[0]
            seq = self.running.get(slot)
            if seq is None or seq.uid != uid:
                heapq.heappop(heap)
            elif slot in gone:
                aside.append((heap, heapq.heappop(heap)))
            else:
                return -key

    def _adopt(self) -> float:
        self.version = self.trainer.version
        self.versions.append((self.steps, self.version))
        seconds = self.p.adopt_s
        self.phase_seconds["adopt"] += seconds
        if self.running and self.recompute_kv:  # re-prefill prompt + tokens so far of every running sequence
            longest = self._top(self.by_reach, set(), []) + self.steps - 1
            recompute = self.p.prefill.seconds(len(self.running), longest)
            self.phase_seconds["recompute_kv"] += recompute
            seconds += recompute
        return seconds

    # -- sequences ---------------------------------------------------------------------------------
    def _admit(self, finished: list[Group]) -> float:
        """Waiting groups take the lowest free slots; returns the prefill's seconds."""
        prompts, width = 0, 0
        while self.waiting and len(self.free) >= self.waiting[0].size:
            group = self.waiting.pop(0)
            self.unfinished.start(group)
            prompt_len = len(group.prompt_ids)
            prompts, width = prompts + 1, max(width, prompt_len)
            for i, target in enumerate(group.forced_lengths):
                seq = _Seq(group, i, heapq.heappop(self.free), prompt_len, target, self.steps - 1, self.steps,
                           self.admitted)
                self.admitted += 1
                self.running[seq.slot] = seq
                heapq.heappush(self.ends, (seq.base + target, seq.slot))
                heapq.heappush(self.by_slot, (-seq.slot, seq.uid, seq.slot))
                heapq.heappush(self.by_reach, (-(prompt_len - seq.base), seq.uid, seq.slot))
        seconds = self.p.prefill.seconds(prompts, width)
        self.phase_seconds["prefill"] += seconds
        self._finish_due(finished)  # a forced length of 1 ends with the prefill's token
        return seconds

    def _finish_due(self, finished: list[Group]) -> None:
        while self.ends and self.ends[0][0] <= self.steps:
            _, slot = heapq.heappop(self.ends)
            seq = self.running.pop(slot)
            heapq.heappush(self.free, slot)
            self._write_out(seq)
            if self.unfinished.end_one(seq.group):
                finished.append(seq.group)

    def _write_out(self, seq: _Seq) -> None:
        """The completion's tokens (placeholders, one shared list per length: nothing reads them but
        their count) and versions: token 1 comes with the prefill (the version of the decode step in
        the same call), token m >= 2 from decode step first + m - 2. `versions` holds one entry per
        run of tokens under one version, not one per token: the orchestrator reads only their min
        and max (staleness, version_min/max), and min() over per-token lists, per sample per use,
        was a large share of the simulation's time."""
        c = seq.group.samples[seq.index].completion
        length = seq.target
        self.tokens_generated += length  # counted when a sequence ends (the engine counts each step)
        if length not in self.blank:
            self.blank[length] = ([0] * length, [-1.0] * length)
        c.tokens, c.logprobs = self.blank[length]
        c.finish_reason = "length"
        first, last = seq.first_step, seq.first_step + length - 2  # decode steps that made tokens 2..length
        i = bisect_right(self.versions, (first, math.inf)) - 1
        runs = [self.versions[i][1]]
        for _, version in self.versions[i + 1:bisect_right(self.versions, (last, math.inf))]:
            runs.append(version)
        c.versions = runs


class ProfiledTrainer:
    """A training step costs the profile's train time for its tokens (slowed while the generator
    works on the same device), then, with N cells, waits for the others and all-reduces; then it
    publishes the version and tells the generator."""

    def __init__(self, profile: Profile, device: Device, publish_s: float, lockstep: Lockstep,
                 allreduce_s: float) -> None:
        self.p, self.device, self.publish_s, self.lockstep, self.allreduce_s = (profile, device, publish_s,
                                                                                  lockstep, allreduce_s)
        self.version = 0
        self.tokens: list[int] = []  # real tokens of each step

    async def train(self, groups: list[Group]) -> dict[str, float]:
        samples = [s for g in groups for s in g.samples]
        tokens = sum(len(s.prompt_ids) + len(s.tokens) for s in samples)
        self.tokens.append(tokens)
        compute = self.p.train.seconds(self.p.train.count(samples))
        if self.lockstep.parties == 1:
            await self._work(compute + self.publish_s)
        else:  # gradients of every cell, all-reduced, then the optimizer step and the publish
            await self._work(compute)
            await self.lockstep.wait()
            await asyncio.sleep(self.allreduce_s)
            await self._work(self.publish_s)
        self.version += 1
        self.device.wake["gen"].set()  # a version to adopt (async mode adopts it mid-rollout)
        return {"loss": 0.0, "train_tokens": float(tokens)}

    async def _work(self, seconds: float) -> None:
        self.device.set_active("train", True)
        await self.device.work("train", seconds)
        self.device.set_active("train", False)

    async def evaluate(self) -> dict[str, float]:
        return {}
