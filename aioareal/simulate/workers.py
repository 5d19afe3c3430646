"""A generator and a trainer whose every step costs what a profile says, for the real orchestrator
on the virtual clock. They keep the contracts of the real workers (slots, whole groups, per-token
policy versions, adoption only when allowed, one version per train call) and the engine's own
rules: lowest free slot first, one prefill per admitted prompt (whose first token comes with it),
a decode step over the first max-slot+1 slots attending over the longest live context, and a KV
recompute of the running sequences when a version is adopted mid-rollout.

Speed: stepping token by token costs Python work per sequence per step, too slow for thousands of
training steps. `ProfiledGenerator.step` therefore runs every decode step up to the next sequence
end in one sleep (their durations add up in closed form); a new version, or the trainer starting or
stopping on a shared device, cuts that sleep short at the end of the decode step in progress, so
adoption happens between the same two steps as in the engine. Sequences carry only counters; their
tokens and per-token versions are written out when they finish.
"""
from __future__ import annotations

import asyncio
import heapq
import math
import random
from bisect import bisect_right
from dataclasses import dataclass
from itertools import count
from typing import Callable

from ..generation import Completion, GroupRequest, GroupResult
from ..samples import Group
from .cell import Device, Lockstep, sleep_unless
from .profile import Profile

# Decode steps one `step` call may cover (tests set 1: the reference path, one step per call).
MAX_DECODE_STEPS_PER_CALL = 1 << 62


@dataclass(slots=True)
class _Seq:
    group: "_GroupRun"
    index: int
    slot: int
    prompt_len: int
    target: int  # forced length
    base: int  # tokens so far = generator.steps - base
    first_step: int  # the decode step during whose call it was admitted (its first token's version)


@dataclass(slots=True)
class _GroupRun:
    request: GroupRequest
    completions: list[Completion]
    unfinished: int


class ProfiledGenerator:
    def __init__(self, profile: Profile, device: Device, trainer: "ProfiledTrainer", slots: int,
                 draw: Callable[[random.Random], int], seed: int, recompute_kv: bool = True) -> None:
        self.p, self.device, self.trainer, self.slots, self.draw = profile, device, trainer, slots, draw
        self.rng = random.Random(seed)  # the bench's ForcedLengths draws with the same seed, in the same order
        self.recompute_kv = recompute_kv
        self.version = 0
        self.tokens_generated = 0
        self.phase_seconds: dict[str, float] = {"prefill": 0.0, "decode": 0.0, "adopt": 0.0, "recompute_kv": 0.0}
        self.waiting: list[GroupRequest] = []
        self.free = list(range(slots))  # a min-heap, as the engine's
        self.running: dict[int, _Seq] = {}  # slot -> sequence
        self.ends: list[tuple[int, int]] = []  # (step at which it ends, slot)
        self.top_slots: list[int] = []  # max-heap (negated) of running slots, stale entries skipped
        self.reach: list[tuple[int, int]] = []  # max-heap (negated) of prompt_len - base, with slot
        self.steps = 0  # decode steps so far
        self.versions = [(0, 0)]  # (first decode step, version) at each adoption
        self.interrupted = 0  # decode sleeps cut short by a new version or a contention change

    # -- the GenerationWorker contract -------------------------------------------------------------
    def submit(self, request: GroupRequest) -> None:
        request.lengths = [self.draw(self.rng) for _ in range(request.n)]
        self.waiting.append(request)
        self.device.set_active("gen", True)

    def free_slots(self) -> int:
        return len(self.free) - sum(r.n for r in self.waiting)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def in_flight(self) -> int:
        return len(self.running)

    async def step(self, adopt: bool) -> list[GroupResult]:
        """One engine step (adopt, admit + prefill, decode), extended over the decode steps to the
        next sequence end unless something it depends on changes first."""
        factor = self.device.factor("gen")
        wake = self.device.wake["gen"]
        wake.clear()  # what happened before this call is already seen by it
        setup = self._adopt() if adopt and self.trainer.version > self.version else 0.0
        finished: list[GroupResult] = []
        setup += self._admit(finished)
        n, span0 = self._shape()
        k = min(self.ends[0][0] - self.steps, MAX_DECODE_STEPS_PER_CALL) if self.running else 0
        planned = (setup + self._decode_s(n, span0, k)) * factor
        loop = asyncio.get_running_loop()
        start = loop.time()
        if await sleep_unless(wake, planned):  # finish the decode step in progress, then return
            done = self._steps_by((loop.time() - start) / factor - setup, n, span0, k)
            self.interrupted += 1
            await asyncio.sleep(max(0.0, start + (setup + self._decode_s(n, span0, done)) * factor - loop.time()))
            k = done
        self.phase_seconds["decode"] += self._decode_s(n, span0, k) * factor
        self._advance(k, finished)
        if not self.busy:
            self.device.set_active("gen", False)
        return finished

    # -- costs -------------------------------------------------------------------------------------
    def _decode_s(self, n: int, span0: int, k: int) -> float:
        """k decode steps of n slots, the span growing by one each step (the closed-form sum)."""
        d = self.p.decode
        return k * (d.a + d.b * n + d.c * n * span0) + d.c * n * k * (k - 1) / 2

    def _steps_by(self, seconds: float, n: int, span0: int, k: int) -> int:
        """Decode steps begun within `seconds` (at least one: a step always decodes), at most k."""
        if k <= 1:
            return k
        lo, hi = 1, k
        while lo < hi:  # the first step count whose total reaches `seconds`
            mid = (lo + hi) // 2
            if self._decode_s(n, span0, mid) >= seconds:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _shape(self) -> tuple[int, int]:
        """(slots decoded: the highest running slot + 1, attention span of the next decode step)."""
        while self.top_slots and -self.top_slots[0] not in self.running:
            heapq.heappop(self.top_slots)
        while self.reach and not self._reaches(*self.reach[0]):
            heapq.heappop(self.reach)
        if not self.running:
            return 0, 0
        return -self.top_slots[0] + 1, -self.reach[0][0] + self.steps

    def _reaches(self, key: int, slot: int) -> bool:
        """Whether a `reach` entry is still its slot's sequence (slots are reused)."""
        seq = self.running.get(slot)
        return seq is not None and seq.prompt_len - seq.base == -key

    def _adopt(self) -> float:
        self.version = self.trainer.version
        self.versions.append((self.steps, self.version))
        seconds = self.p.adopt_s
        self.phase_seconds["adopt"] += seconds
        if self.running and self.recompute_kv:  # re-prefill prompt + tokens so far of every running sequence
            _, span = self._shape()
            recompute = self.p.prefill.seconds(len(self.running), span - 1)
            self.phase_seconds["recompute_kv"] += recompute
            seconds += recompute
        return seconds

    # -- sequences ---------------------------------------------------------------------------------
    def _admit(self, finished: list[GroupResult]) -> float:
        """Waiting groups take the lowest free slots; returns the prefill's seconds."""
        prompts, width = 0, 0
        while self.waiting and len(self.free) >= self.waiting[0].n:
            request = self.waiting.pop(0)
            group = _GroupRun(request, [Completion() for _ in range(request.n)], request.n)
            prompt_len = len(request.prompt_ids)
            prompts, width = prompts + 1, max(width, prompt_len)
            for i, target in enumerate(request.lengths):
                seq = _Seq(group, i, heapq.heappop(self.free), prompt_len, target, self.steps - 1, self.steps)
                self.running[seq.slot] = seq
                heapq.heappush(self.top_slots, -seq.slot)
                heapq.heappush(self.reach, (-(prompt_len - seq.base), seq.slot))
                heapq.heappush(self.ends, (seq.base + target, seq.slot))
        seconds = self.p.prefill.seconds(prompts, width)
        self.phase_seconds["prefill"] += seconds
        self._finish_due(finished)  # a forced length of 1 ends with the prefill's token
        return seconds

    def _advance(self, k: int, finished: list[GroupResult]) -> None:
        self.steps += k
        self.tokens_generated += k * len(self.running)
        self._finish_due(finished)

    def _finish_due(self, finished: list[GroupResult]) -> None:
        while self.ends and self.ends[0][0] <= self.steps:
            _, slot = heapq.heappop(self.ends)
            seq = self.running.pop(slot)
            heapq.heappush(self.free, slot)
            self._write_out(seq)
            seq.group.unfinished -= 1
            if seq.group.unfinished == 0:
                finished.append(GroupResult(seq.group.request, seq.group.completions))

    def _write_out(self, seq: _Seq) -> None:
        """The completion's tokens, and each token's version: token 1 comes with the prefill (the
        version of the decode step in the same call), token m >= 2 from decode step first + m - 2."""
        c = seq.group.completions[seq.index]
        length = seq.target
        c.tokens, c.logprobs, c.finish_reason = [0] * length, [-1.0] * length, "length"
        first, last = seq.first_step, seq.first_step + length - 2  # decode steps that made tokens 2..length
        i = bisect_right(self.versions, (first, math.inf)) - 1
        versions = [self.versions[i][1]]
        step = first
        while step <= last:
            end = self.versions[i + 1][0] if i + 1 < len(self.versions) else last + 1
            versions += [self.versions[i][1]] * (min(end, last + 1) - step)
            step, i = min(end, last + 1), i + 1
        c.versions = versions[:length]


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
        tokens = sum(len(s.prompt_ids) + len(s.tokens) for g in groups for s in g.samples)
        self.tokens.append(tokens)
        compute = self.p.train.seconds(tokens)
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
