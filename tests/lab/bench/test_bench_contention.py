"""bench profile's contention probe (bench/measure.py `contention`) on the virtual clock, with a
fake generator whose steps cost what the test says: the probe must read the slowdown it is given,
whatever the admissions (prefills) in the steps it compares."""
from __future__ import annotations

import asyncio

import pytest

from aioareal.lab.bench import measure
from aioareal.lab.simulate.virtualclock import run_virtual
from aioareal.trainer.batching import Layouts

DECODE, PREFILL, TRAIN = 1.0, 7.0, 40.0  # virtual seconds: a decode step, a prompt's prefill, a train step


class FakeTrainer:
    """A train step of TRAIN virtual seconds; `training` is set meanwhile."""

    def __init__(self) -> None:
        self.training = False
        self.trainer = type("T", (), {"micro_batch_tokens": 1024, "layouts": Layouts()})()

    async def train(self, groups: list) -> dict[str, float]:
        self.training = True
        await asyncio.sleep(TRAIN)
        self.training = False
        return {}


class FakeGenerator:
    """`slots` slots; a step costs DECODE plus PREFILL per prompt admitted in it, times `slowdown`
    while the trainer trains. Each sequence ends after its forced length of steps."""

    def __init__(self, trainer: FakeTrainer, slots: int, slowdown: float) -> None:
        self.trainer, self.slowdown = trainer, slowdown
        self.free, self.waiting, self.running = slots, [], []  # running: steps left per sequence

    def free_slots(self) -> int:
        return self.free - sum(g.size for g in self.waiting)

    def submit(self, request) -> None:
        self.waiting.append(request)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    async def step(self, adopt: bool) -> list:
        await asyncio.sleep(0)  # as a thread hand-off would: a train step created just before starts first
        cost = DECODE + PREFILL * len(self.waiting)
        for request in self.waiting:
            self.free -= request.size
            self.running += list(request.forced_lengths)
        self.waiting = []
        await asyncio.sleep(cost * (self.slowdown if self.trainer.training else 1.0))
        left = [n - 1 for n in self.running]
        self.running = [n for n in left if n > 0]
        self.free += len(left) - len(self.running)
        return []


@pytest.mark.parametrize("slowdown", [1.0, 1.25, 2.0])
def test_the_probe_reads_the_decode_slowdown_it_is_given(monkeypatch, slowdown):
    """Steps that admit prompts cost 8x a plain one. The first admission runs before the train step
    starts, so the unpaired comparison the probe made before (the first few steps alone vs the
    steps inside training) read 0.59, 0.74 and 1.18 here for slowdowns of 1, 1.25 and 2 (and the
    profile clamps below 1 to 1). Pairing step i with step i reads the slowdown itself."""
    async def probe() -> dict[str, float]:
        monkeypatch.setattr(measure.time, "perf_counter", asyncio.get_running_loop().time)
        trainer = FakeTrainer()
        worker = FakeGenerator(trainer, slots=8, slowdown=slowdown)
        return await measure.contention(worker, trainer, [], size=4, width=16, length=6, rounds=2, vocab=50,
                                        seed=0)

    c = run_virtual(probe())
    assert c["decode_steps_inside"] >= 10
    assert c["decode_with_train_s"] / c["decode_alone_s"] == pytest.approx(slowdown)
    assert c["train_with_decode_s"] == pytest.approx(TRAIN) and c["train_alone_s"] == pytest.approx(TRAIN)
