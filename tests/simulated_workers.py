"""Test doubles: a generator and a trainer with modelled latencies, for the orchestrator's
virtual-clock tests. They honour the same contracts as the real workers: slots, whole groups,
per-token policy versions, adoption only when allowed, one version per train call."""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from aioareal.generation.scheduler import GroupTally
from aioareal.group import Completion, Group
from aioareal.lab.simulate.costed_workers import QueuedSequences


@dataclass
class _Seq:
    group: Group
    target: int
    completion: Completion


class SimulatedGenerator(QueuedSequences):
    """Decode step time = base + per_seq * running sequences (memory-bound decode)."""

    def __init__(self, slots: int, trainer: SimulatedTrainer, length: Callable[[random.Random], int],
                 step_base: float = 0.02, step_per_seq: float = 0.0002, recompute_time: float = 0.05,
                 seed: int = 0) -> None:
        self.slots, self.trainer, self.length = slots, trainer, length
        self.step_base, self.step_per_seq, self.recompute_time = step_base, step_per_seq, recompute_time
        self.rng = random.Random(seed)
        self.waiting: list[Group] = []
        self.unfinished = GroupTally()
        self.running: list[_Seq] = []
        self.version = 0
        self.tokens_generated = 0
        self.adoptions = 0
        self.phase_seconds: dict[str, float] = {"decode": 0.0}

    def submit(self, group: Group) -> None:
        self.waiting.append(group)

    def free_slots(self) -> int:
        return self.slots - len(self.running) - sum(g.size for g in self.waiting)

    async def step(self, adopt: bool) -> list[Group]:
        latency = self.step_base + self.step_per_seq * len(self.running)
        if adopt and self.trainer.version > self.version:
            self.version = self.trainer.version
            self.adoptions += 1
            latency += self.recompute_time if self.running else 0.0
        while self.waiting and self.slots - len(self.running) >= self.waiting[0].size:
            group = self.waiting.pop(0)
            for completion in self.unfinished.start(group):
                self.running.append(_Seq(group, self.length(self.rng), completion))
        await asyncio.sleep(latency)
        self.phase_seconds["decode"] += latency
        finished: list[Group] = []
        still: list[_Seq] = []
        for seq in self.running:
            c = seq.completion
            c.tokens.append(1)
            c.logprobs.append(-1.0)
            c.versions.append(self.version)
            self.tokens_generated += 1
            if len(c.tokens) < seq.target:
                still.append(seq)
                continue
            c.finish_reason = "stop"
            if self.unfinished.end_one(seq.group):
                finished.append(seq.group)
        self.running = still
        return finished


class SimulatedTrainer:
    """A training step takes base + per_token * tokens virtual seconds and bumps the version."""

    def __init__(self, base: float = 0.5, per_token: float = 0.0, eval_time: float = 0.0) -> None:
        self.base, self.per_token, self.eval_time = base, per_token, eval_time
        self.version = 0
        self.trained_group_ids: list[int] = []
        self.batches: list[list[Group]] = []

    async def train(self, groups: list[Group]) -> dict[str, float]:
        tokens = sum(len(s.tokens) for g in groups for s in g.samples)
        await asyncio.sleep(self.base + self.per_token * tokens)
        self.trained_group_ids += [g.group_id for g in groups]
        self.batches.append(groups)
        self.version += 1
        return {"loss": 0.0, "train_tokens": tokens}

    async def evaluate(self) -> dict[str, float]:
        await asyncio.sleep(self.eval_time)
        return {"eval_pass_rate": float("nan")}
