"""The measurements behind `bench profile`, each through the same workers the orchestrator drives
(`EngineWorker.step`, `TrainerWorker.train`), so thread hand-offs and host bookkeeping are in them."""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from statistics import fmean

from ...grading.verify import math_equal
from ...group import Completion, Example, Group, Sample
from ...orchestrator import EngineWorker, TrainerWorker
from ...rewards.service import RewardService, per_item
from ...trainer.batching import computed_positions
from ..simulate.lengths import length_sampler

# The decode steps measured per point skip this many first (the prefill's step, a warm-up step).
SKIP = 2


@dataclass
class EnginePoints:
    decode: list[list[float]]  # [slots decoded, mean span, seconds per step]
    prefill: list[list[float]]  # [prompts, width, extra seconds of the admission step]


async def _step(worker: EngineWorker) -> float:
    start = time.perf_counter()
    await worker.step(False)
    return time.perf_counter() - start


async def engine_point(worker: EngineWorker, groups: int, size: int, width: int, repeats: int,
                       vocab: int, rng: random.Random) -> tuple[list[float], list[float]]:
    """Admit `groups` prompts of `width` tokens (x `size` samples), time the admission step's
    prefill and `repeats` decode steps after it; then let the sequences finish."""
    for g in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(width)]
        worker.submit(Group(g, prompt, size, forced_lengths=[SKIP + repeats + 2] * size))  # end after the timed steps
    before = dict(worker.phase_seconds)
    await _step(worker)
    prefill = sum(worker.phase_seconds.get(k, 0.0) - before.get(k, 0.0) for k in ("admit", "prefill"))
    await _step(worker)  # warm-up
    times = [await _step(worker) for _ in range(repeats)]
    while worker.busy:
        await _step(worker)
    span = width + SKIP + (repeats + 1) / 2  # the mean attention span of the timed steps
    # The mean, not the median: a run's throughput pays for the slow steps too (a busy machine's).
    return [groups * size, span, fmean(times)], [groups, width, prefill]


async def engine_points(worker: EngineWorker, size: int, slots: int, widths: list[int], repeats: int,
                        vocab: int, seed: int) -> EnginePoints:
    rng = random.Random(seed)
    counts = sorted({max(1, slots // size // d) for d in (8, 4, 2, 1)})  # groups admitted at once
    decode, prefill = [], []
    for groups in counts:
        for width in widths:
            d, p = await engine_point(worker, groups, size, width, repeats, vocab, rng)
            decode.append(d)
            prefill.append(p)
    return EnginePoints(decode, prefill)


def synthetic_groups(batch: int, size: int, prompt_len: int, mean: float, cap: int, version: int,
                     vocab: int, rng: random.Random) -> list[Group]:
    """B groups of G samples with GSM8K-like lengths, random tokens and random 0/1 rewards."""
    draw = length_sampler("gsm8k", mean, cap)
    groups = []
    for g in range(batch):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        group = Group(g, prompt, size, Example(str(g), "", ""), version)
        for _ in range(size):
            n = draw(rng)
            completion = Completion([rng.randrange(vocab) for _ in range(n)], [-1.0] * n, [version] * n, "length")
            group.samples.append(Sample(prompt, completion, float(rng.random() < 0.5)))
        groups.append(group)
    return groups


async def train_point(trainer: TrainerWorker, groups: list[Group]) -> tuple[int, float, float]:
    """(token positions the trainer computes, seconds of the step without the publish, seconds of
    the publish); positions as batching.computed_positions counts them."""
    t = trainer.trainer
    tokens = computed_positions([s for g in groups for s in g.samples], t.micro_batch_tokens, t.layouts)
    start = time.perf_counter()
    metrics = await trainer.train(groups)
    seconds = time.perf_counter() - start
    publish = metrics.get("time_publish", 0.0)
    return tokens, seconds - publish, publish


async def keep_decoding(worker: EngineWorker, size: int, width: int, length: int, until: Callable[[int], bool],
                        vocab: int, rng: random.Random) -> list[tuple[float, float]]:
    """Decode with every slot busy (a finished group is replaced at once, as async mode does) until
    `until(steps so far)`; returns each step's (start, end) on the perf_counter clock."""
    steps: list[tuple[float, float]] = []
    next_id = 10_000
    while not until(len(steps)):
        while worker.free_slots() >= size:
            prompt = [rng.randrange(vocab) for _ in range(width)]
            worker.submit(Group(next_id, prompt, size, forced_lengths=[length] * size))
            next_id += 1
        start = time.perf_counter()
        await worker.step(False)
        steps.append((start, time.perf_counter()))
    while worker.busy:
        await worker.step(False)
    return steps


async def contention(worker: EngineWorker, trainer: TrainerWorker, groups: list[Group], size: int, width: int,
                     length: int, rounds: int, vocab: int, seed: int) -> dict[str, float]:
    """Train-step time while the generator decodes vs alone, and decode-step time while the trainer
    trains vs alone: the slowdowns of a single-device cell.

    The decode side is paired: each round decodes one sequence of steps while a train step runs,
    then the same sequence again alone (same prompts, same forced lengths, so step i has the same
    slots, span and admissions both times), and compares the steps that ran wholly inside the train
    step with the same steps alone. Unpaired means were biased by what the two windows happened to
    hold: the alone one held the first admission's prefill, the other did not, and the probe read
    decoding as faster while training where the end-to-end run decoded the same steps slower.
    Alone and together alternate for `rounds` rounds, so a change in the machine's speed meanwhile
    hits both sides of each ratio."""
    alone = inside = 0.0
    paired = 0
    train_alone = train_with = 0.0
    for r in range(rounds):
        seconds, steps, within = await _train_while_decoding(worker, trainer, groups, size, width, length, vocab,
                                                            random.Random(seed + r))
        train_with += seconds
        total = len(steps)  # the same steps again, alone
        again = await keep_decoding(worker, size, width, length, lambda n, total=total: n >= total, vocab,
                                    random.Random(seed + r))
        train_alone += (await train_point(trainer, groups))[1]
        for (s, e), (s2, e2), counted in zip(steps, again, within):
            if counted:
                inside, alone, paired = inside + e - s, alone + e2 - s2, paired + 1
    decode_alone = alone / paired if paired else 0.0
    return {"train_alone_s": train_alone / rounds, "train_with_decode_s": train_with / rounds,
            "decode_alone_s": decode_alone, "decode_with_train_s": inside / paired if paired else decode_alone,
            "decode_steps_inside": paired}


async def _train_while_decoding(worker: EngineWorker, trainer: TrainerWorker, groups: list[Group], size: int,
                                width: int, length: int, vocab: int,
                                rng: random.Random) -> tuple[float, list[tuple[float, float]], list[bool]]:
    """One train step with every slot decoding meanwhile: its seconds, every decode step's (start,
    end), and whether each ran wholly inside the train step."""
    window: list[float] = []
    done = asyncio.Event()

    async def train() -> float:
        window.append(time.perf_counter())
        _, seconds, _ = await train_point(trainer, groups)
        window.append(time.perf_counter())
        done.set()
        return seconds

    task = asyncio.create_task(train())
    steps = await keep_decoding(worker, size, width, length, lambda n: done.is_set(), vocab, rng)
    seconds = await task
    return seconds, steps, [s >= window[0] and e <= window[1] for s, e in steps]


async def reward_seconds(size: int, repeats: int) -> float:
    """One group's round trip through the reward service scoring GSM8K-style answers (extraction,
    numeric compare; math-verify where the numbers do not parse)."""
    texts = ["... so she has 18 eggs left. The answer is \\boxed{18}.", "Total: 3/4 of the cake, \\boxed{\\frac{3}{4}}"]
    service = RewardService(per_item(lambda text, example: math_equal(example.answer, text)),
                            decode=lambda ids: texts[ids[0] % len(texts)], workers=4)
    examples = [Example(str(i), "", "18") for i in range(size)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        await service.score([[i] for i in range(size)], examples)
        times.append(time.perf_counter() - start)
    return fmean(sorted(times)[: max(1, repeats // 2)])  # the faster half: thread start-up noise aside
