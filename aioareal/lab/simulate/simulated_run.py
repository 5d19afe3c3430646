"""One simulated run: the real `Orchestrator` (admission, oldest-first batches, interruption,
weight adoption) of every cell, driven by profile-costed workers on the virtual clock."""
from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from ...checkpoint import RunState
from ...group import Example, Group
from ...orchestrator import Orchestrator, Schedule, StepReport
from ...orchestrator.loop import PromptSource
from .contention import Device, Lockstep, Topology
from .cost_profile import Profile
from .costed_workers import ProfiledGenerator, ProfiledTrainer
from .lengths import Draw
from .virtualclock import run_virtual

PROMPTS = 512  # distinct prompts, cycled (their content never matters here)


@dataclass
class Setting:
    """The workload: what `bench e2e` (or a run's config) would run."""

    batch_groups: int = 8  # B, per cell
    group_size: int = 8  # G
    prompt_len: int = 128
    slots: int = 0  # 0: B x G, as a real run
    steps: int = 300  # timed steps
    warmup_steps: int = 5  # untimed steps first (the pipeline filling up)
    seed: int = 0
    reward_s: float | None = None  # None: the profile's
    recompute_kv: bool = True
    single_steps: bool = False  # one decode step per generator call: the reference the fast path is checked against


@dataclass
class Result:
    mode: str
    k: int
    samples_per_s: float
    s_per_step: float
    gen_idle: float  # fraction of the timed wall clock the generator was not stepping (mean over cells)
    train_idle: float
    staleness: dict[int, int]  # samples trained at each staleness, timed steps
    interrupted: float  # fraction of samples whose tokens came from more than one version
    len_mean: float
    sim_seconds: float  # real seconds the simulation took

    @property
    def staleness_mean(self) -> float:
        total = sum(self.staleness.values())
        return sum(s * n for s, n in self.staleness.items()) / total if total else 0.0


@dataclass
class Recorder:
    """Orchestrator hooks: per step (time, generator busy s, trainer busy s) and the timed samples."""

    warmup: int
    orchestrator: Orchestrator | None = None
    marks: list[tuple[float, float, float]] = field(default_factory=lambda: [(0.0, 0.0, 0.0)])
    staleness: Counter = field(default_factory=Counter)
    interrupted: int = 0
    lengths: list[int] = field(default_factory=list)

    async def on_step(self, report: StepReport) -> None:
        if not report.groups:  # the step-0 evaluation
            return
        busy = self.orchestrator.busy
        self.marks.append((report.row["time"], busy["gen"], busy["train"]))
        if report.step > self.warmup:
            self.staleness.update(report.staleness)
            self.interrupted += sum(s["version_min"] < s["version_max"] for s in report.samples)
            self.lengths += [s["length"] for s in report.samples]

    async def on_stop(self, state: RunState) -> None:
        pass


def _cell(profile: Profile, setting: Setting, topology: Topology, schedule: Schedule, draw: Draw,
          lockstep: Lockstep, index: int) -> tuple[Orchestrator, Recorder]:
    device = Device(profile, shared=topology.devices_per_cell == 1)
    trainer = ProfiledTrainer(profile, device, topology.publish_s(profile), lockstep, topology.allreduce_s(profile))
    slots = setting.slots or setting.batch_groups * setting.group_size
    # Cell 0 draws the lengths `bench e2e` forces with the same seed, group by group.
    gen = ProfiledGenerator(profile, device, trainer, slots, draw, setting.seed + index, setting.recompute_kv,
                             setting.single_steps)
    # Distinct prompts (only their lengths cost anything): a trainer with shared prompts computes
    # each group's prompt once, and equal prompts across groups would count once in all.
    prompts = PromptSource([Example(str(i), "", "") for i in range(PROMPTS)],
                           lambda e: [int(e.uid)] + [0] * (setting.prompt_len - 1), setting.seed)
    rewards = random.Random(setting.seed + 1 + index)
    reward_s = profile.reward_s if setting.reward_s is None else setting.reward_s

    async def score(group: Group) -> tuple[list[float], int]:
        if reward_s > 0:
            await asyncio.sleep(reward_s)
        return [float(rewards.random() < 0.5) for _ in group.samples], 0

    recorder = Recorder(setting.warmup_steps)
    orchestrator = Orchestrator(schedule, gen, trainer, prompts, score, recorder)
    recorder.orchestrator = orchestrator
    return orchestrator, recorder


def simulate(profile: Profile, setting: Setting, topology: Topology, draw: Draw, mode: str, k: int) -> Result:
    """Run `mode` with staleness bound `k` for warmup + timed steps on every cell; measure the
    timed steps as `bench e2e` does."""
    started = time.perf_counter()
    s = setting
    schedule = Schedule(mode, k, s.batch_groups, s.group_size, s.warmup_steps + s.steps, eval_every=0)
    lockstep = Lockstep(topology.cells)
    cells = [_cell(profile, s, topology, schedule, draw, lockstep, i) for i in range(topology.cells)]

    async def run_all() -> None:
        await asyncio.gather(*(o.run() for o, _ in cells))

    run_virtual(run_all())
    return summarise(mode, k, s, [r for _, r in cells], time.perf_counter() - started)


def summarise(mode: str, k: int, s: Setting, recorders: list[Recorder], sim_seconds: float) -> Result:
    first = recorders[0]
    (t0, _, _), (t1, _, _) = first.marks[s.warmup_steps], first.marks[-1]
    wall = t1 - t0
    idle = [[max(0.0, 1 - (r.marks[-1][i] - r.marks[s.warmup_steps][i]) / wall) for r in recorders] for i in (1, 2)]
    staleness: Counter = Counter()
    for r in recorders:
        staleness.update(r.staleness)
    samples = len(recorders) * s.steps * s.batch_groups * s.group_size
    lengths = [n for r in recorders for n in r.lengths]
    return Result(mode, k, samples / wall, wall / s.steps, sum(idle[0]) / len(recorders),
                  sum(idle[1]) / len(recorders), dict(sorted(staleness.items())),
                  sum(r.interrupted for r in recorders) / samples, sum(lengths) / len(lengths), sim_seconds)
