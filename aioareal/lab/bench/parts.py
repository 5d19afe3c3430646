"""The real parts of a training run for `bench e2e`, built by the same builders as `run.setup`
(run/build.py) but with random weights, synthetic prompts, random 0/1 rewards, no
evaluation, and forced completion lengths."""
from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ...checkpoint import RunState
from ...config import AlgoConfig, Config, GenerationConfig, RolloutConfig, RunConfig, TrainConfig
from ...devices import threads_restored, with_run_threads
from ...group import Example, Group
from ...orchestrator import EngineWorker, Orchestrator, Schedule, StepReport, TrainerWorker
from ...orchestrator.loop import PromptSource
from ...run.build import Models, build_engine, build_trainer, build_workers, context_length
from ...run.events import run_event_loop
from ...trainer import Trainer
from ...trainer.batching import computed_positions
from .flops import FlopModel
from .gen import eos_ids
from .harness import build_model

PROMPTS = 512  # distinct synthetic prompts (cycled epoch after epoch)


class ForcedLengths:
    """A generation worker that gives every sample of a submitted group a length drawn from a
    distribution (random weights never choose to stop), then delegates to the engine worker. The
    orchestrator is unchanged: it sees the GenerationWorker contract."""

    def __init__(self, worker: EngineWorker, draw: Callable[[random.Random], int], seed: int) -> None:
        self.worker, self.draw, self.rng = worker, draw, random.Random(seed)

    def submit(self, group: Group) -> None:
        group.forced_lengths = [self.draw(self.rng) for _ in range(group.size)]
        self.worker.submit(group)

    def __getattr__(self, name: str) -> Any:  # version, decode_tokens, free_slots, busy, in_flight, step
        return getattr(self.worker, name)


@dataclass
class Timeline:
    """Orchestrator hooks that stamp each step: (step, time, generator busy s, trainer busy s)."""

    orchestrator: Orchestrator | None = None
    warmup: int = 0
    marks: list[tuple[int, float, float, float]] = field(default_factory=lambda: [(0, 0.0, 0.0, 0.0)])
    lengths: list[int] = field(default_factory=list)
    staleness_max: int = 0
    interrupted: int = 0  # timed samples whose tokens came from more than one version (a weight swap mid-rollout)
    # Seconds per named phase over the timed steps (the rows' `time_*`: the trainer's loss,
    # optimizer...; the generator's decode, prefill, recompute_kv, score): where a mode's time went.
    phases: dict[str, float] = field(default_factory=dict)
    # Tokens the generator's decode steps sampled by each mark (the scheduler's one counter: read
    # here on the loop's thread while a generator step may be half done); the timed steps' groups.
    counts: list[int] = field(default_factory=lambda: [0])
    trained: list[list[Group]] = field(default_factory=list)

    async def on_step(self, report: StepReport) -> None:
        if not report.groups:  # the step-0 evaluation
            return
        busy, gen = self.orchestrator.busy, self.orchestrator.gen
        self.marks.append((report.step, report.row["time"], busy["gen"], busy["train"]))
        self.counts.append(gen.decode_tokens)
        if report.step > self.warmup:
            self.trained.append(report.groups)  # their positions are counted after the run (host work)
            self.lengths += [len(s.tokens) for g in report.groups for s in g.samples]
            self.staleness_max = max(self.staleness_max, report.row["staleness_max"])
            self.interrupted += sum(s["version_min"] < s["version_max"] for s in report.samples)
            for key, value in report.row.items():
                if key.startswith("time_"):
                    self.phases[key[5:]] = self.phases.get(key[5:], 0.0) + value

    async def on_stop(self, state: RunState) -> None:
        pass


@dataclass
class ModeResult:
    samples_per_s: float
    s_per_step: float
    step_seconds: list[float]
    gen_idle: float  # fraction of the timed wall clock the generator was not stepping
    train_idle: float
    lengths: list[int]
    staleness_max: int
    phases: dict[str, float]  # seconds per timed step in each phase (Timeline.phases)
    interrupted: float  # fraction of timed samples generated under more than one version
    decode_tokens: float  # per timed step: tokens sampled by decode steps (not the first, sampled in prefill)
    loss_positions: tuple[float, float]  # per timed step: (positions trained, positions the LM head runs on)
    loss_dtype: torch.dtype  # what the trainer's matmuls compute in (its autocast dtype, else fp32)
    flops: FlopModel  # the model's FLOP counts (flops.py)


def e2e_config(args: argparse.Namespace, mode: str, k: int, steps: int) -> Config:
    return Config(algo=AlgoConfig(group_size=args.group_size, batch_groups=args.batch_groups),
                  generation=GenerationConfig(max_new_tokens=args.max_new_tokens, cuda_graphs=args.cuda_graphs,
                                              num_slots=args.slots, temperature=1.0, top_p=1.0),
                  rollout=RolloutConfig(mode=mode, max_staleness=k),
                  train=TrainConfig(steps=steps, micro_batch_tokens=args.micro_batch_tokens),
                  run=RunConfig(seed=args.seed))


def build(args: argparse.Namespace, config: Config, device: torch.device, dtype: torch.dtype,
          draw: Callable[[random.Random], int], one_thread: int | None = None) -> tuple[ForcedLengths, TrainerWorker]:
    gen_model = build_model(args.model, dtype, device, args.seed)
    train_model = build_model(args.model, torch.float32, device, args.seed)  # same seed: same weights
    max_len = context_length(gen_model, args.prompt_len, config.generation.max_new_tokens,
                             "--prompt-len + --max-new-tokens")
    engine = build_engine(config, gen_model, eos_ids(gen_model), max_len, compile=args.compile)
    models = Models(gen_model, train_model, None, dtype)
    trainer = build_trainer(config, models, train_model.config.pad_token_id or 0)
    # A bench forces lengths past EOS on random weights: it reports the gap, it is no run to stop.
    trainer.max_logprob_gap = math.inf
    generator, trainer_worker = build_workers(engine, trainer, gen_model, lambda: {}, one_thread=one_thread)
    return ForcedLengths(generator, draw, args.seed), trainer_worker


def synthetic_prompts(length: int, vocab: int, seed: int) -> PromptSource:
    rng = random.Random(seed)
    table = [[rng.randrange(vocab) for _ in range(length)] for _ in range(PROMPTS)]
    examples = [Example(str(i), "", "") for i in range(PROMPTS)]
    return PromptSource(examples, lambda e: table[int(e.uid)], seed)


def run_mode(args: argparse.Namespace, mode: str, k: int, device: torch.device, dtype: torch.dtype,
             draw: Callable[[random.Random], int]) -> ModeResult:
    config = e2e_config(args, mode, k, args.warmup_steps + args.steps)
    with threads_restored():
        gen, train = with_run_threads(lambda team: build(args, config, device, dtype, draw, team),
                                      [device, device], overlapping=mode != "sync")
        return _run(args, config, mode, k, gen, train)


def _run(args: argparse.Namespace, config: Config, mode: str, k: int, gen: ForcedLengths,
         train: TrainerWorker) -> ModeResult:
    rewards = random.Random(args.seed + 1)

    async def score(group: Group) -> tuple[list[float], int]:
        return [float(rewards.random() < 0.5) for _ in group.samples], 0

    schedule = Schedule(mode, k, args.batch_groups, args.group_size, config.train.steps, eval_every=0)
    vocab = gen.worker.engine.model.config.vocab_size
    timeline = Timeline(warmup=args.warmup_steps)
    orchestrator = Orchestrator(schedule, gen, train, synthetic_prompts(args.prompt_len, vocab, args.seed),
                                score, timeline)
    timeline.orchestrator = orchestrator
    try:
        run_event_loop(orchestrator.run())
    finally:
        gen.worker.close()
        train.close()
    return summarise(timeline, args, train.trainer)


def summarise(t: Timeline, args: argparse.Namespace, trainer: Trainer) -> ModeResult:
    (_, t0, g0, r0), (_, t1, g1, r1) = t.marks[args.warmup_steps], t.marks[-1]
    wall = t1 - t0
    times = [m[1] for m in t.marks[args.warmup_steps:]]
    samples = args.steps * args.batch_groups * args.group_size
    per_step = [trained_positions(trainer, groups) for groups in t.trained]
    computed, head = sum(c for c, _ in per_step), sum(h for _, h in per_step)
    return ModeResult(samples / wall, wall / args.steps, [b - a for a, b in zip(times, times[1:])],
                      max(0.0, 1 - (g1 - g0) / wall), max(0.0, 1 - (r1 - r0) / wall), t.lengths, t.staleness_max,
                      {name: seconds / args.steps for name, seconds in t.phases.items()},
                      t.interrupted / samples, (t.counts[-1] - t.counts[args.warmup_steps]) / args.steps,
                      (computed / args.steps, head / args.steps), trainer.autocast_dtype or torch.float32,
                      FlopModel.of(trainer.model))


def trained_positions(trainer: Trainer, groups: list[Group]) -> tuple[int, int]:
    """(positions the trainer's forwards compute, positions its LM head runs on) in the step that
    trains these groups: mini-batches of whole groups, each planned by the token budget as
    `Trainer.pack` does and laid out as it lays them (batching.computed_positions: shared prompts,
    prefix tree, padding included), every PPO epoch; the head runs on completion positions only."""
    per = math.ceil(len(groups) / trainer.algo.minibatches) or 1
    parts = [[s for g in groups[i:i + per] for s in g.samples] for i in range(0, len(groups), per)]
    computed = sum(computed_positions(p, trainer.micro_batch_tokens, trainer.layouts) for p in parts)
    head = sum(len(s.tokens) for g in groups for s in g.samples)
    return trainer.algo.ppo_epochs * computed, trainer.algo.ppo_epochs * head
