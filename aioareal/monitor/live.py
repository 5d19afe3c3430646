"""Live state of a run for the dashboard: a snapshot built on the event loop, read from rich's thread.

The run `record`s each step's metrics row (histories live here, bounded) and, a few times a second,
`refresh`es the snapshot with the orchestrator's live counters (versions, queue depths), all on the
event loop's thread. The dashboard's refresh thread only reads `latest`, a finished `Snapshot`
swapped in whole: it never iterates a deque the loop is changing, and takes no lock the loop
could wait on.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# The episodes' figures of a step row the dashboard shows (metrics.py `episode_figures`).
EPISODE_KEYS = ("turns_mean", "obs_tokens_mean", "tool_calls", "tool_errors", "tool_latency_mean", "episode_errors")


@dataclass
class Snapshot:
    run_name: str = ""
    mode: str = "sync"
    max_staleness: int = 0
    objective: str = "ppo"
    devices: str = "cpu"
    elapsed: float = 0.0  # seconds since the run started
    eta: float | None = None  # seconds to the last step, from the recent step rate
    step: int = 0
    steps_total: int = 0
    trainer_version: int = 0
    generator_version: int = 0
    groups_running: int = 0  # admitted, being generated or scored
    groups_ready: int = 0  # finished, at the head of the line, waiting for the trainer
    gen_tokens_per_s: float = 0.0
    train_tokens_per_s: float = 0.0
    samples_per_s: float = 0.0
    gen_busy: list[float] = field(default_factory=list)  # busy fraction per recent step, oldest first
    train_busy: list[float] = field(default_factory=list)
    staleness_hist: dict[int, int] = field(default_factory=dict)  # staleness -> samples, recent batches
    dropped_stale: int = 0
    rejected: int = 0
    reward_failures: int = 0
    rewards: list[float] = field(default_factory=list)  # reward_mean per recent step
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out pass rate)
    loss: float | None = None
    kl: float | None = None
    grad_norm: float | None = None
    clip_frac: float | None = None
    behav_weight_mean: float | None = None  # pi_prox (or pi) / pi_behav over trained tokens: how off-policy
    behav_weight_max: float | None = None
    capped_frac: float | None = None  # decoupled: tokens whose behaviour weight is over algo.behav_cap
    logprob_gap_mean: float | None = None  # |log pi_trainer - log pi_behav| on the trainer's version's tokens
    logprob_gap_max: float | None = None
    completion: str | None = None  # the latest trained sample's text (samples.jsonl's, already cut)
    completion_prompt: str | None = None  # the prompt it answers (samples.jsonl's, shortened)
    completion_reward: float | None = None  # and its reward, at step `completion_step`
    completion_step: int = 0
    gpu_memory: list[tuple[str, float, float]] = field(default_factory=list)  # (device, used GiB, total GiB)
    train_phases: dict[str, float] = field(default_factory=dict)  # seconds per phase of the last step
    gen_phases: dict[str, float] = field(default_factory=dict)  # generator seconds per phase, same interval
    episode: dict[str, float] = field(default_factory=dict)  # episodes' figures of the last step (none: no episodes)
    world_size: int = 1  # torchrun ranks (cells); their busy fractions in the last step, rank order:
    gen_busy_ranks: list[float] = field(default_factory=list)
    train_busy_ranks: list[float] = field(default_factory=list)


class LiveState:
    HISTORY = 120  # steps kept for sparklines and busy bars
    STALENESS_BATCHES = 10  # batches in the staleness histogram

    def __init__(self, run_name: str, mode: str, max_staleness: int, objective: str, devices: list[torch.device],
                 steps_total: int, world_size: int = 1) -> None:
        """`devices`: this process's generator and trainer devices; `world_size`: torchrun ranks."""
        names = " / ".join(dict.fromkeys(str(d) for d in devices))
        self.base = Snapshot(run_name=run_name, mode=mode, max_staleness=max_staleness, objective=objective,
                             devices=names if world_size == 1 else f"{names} on rank 0  ·  {world_size} ranks",
                             steps_total=steps_total, world_size=world_size)
        self.cuda_devices = [d for d in dict.fromkeys(devices) if d.type == "cuda"]
        self.started = time.monotonic()
        self.last_row: dict[str, Any] = {}
        self.rewards: deque[float] = deque(maxlen=self.HISTORY)
        self.gen_busy: deque[float] = deque(maxlen=self.HISTORY)
        self.train_busy: deque[float] = deque(maxlen=self.HISTORY)
        self.evals: deque[tuple[int, float]] = deque(maxlen=self.HISTORY)
        self.staleness: deque[Counter] = deque(maxlen=self.STALENESS_BATCHES)
        self.step_times: deque[tuple[int, float]] = deque(maxlen=20)
        self.counters: dict[str, int] = {}
        self.last_sample: dict[str, Any] = {}  # the latest samples.jsonl row: the dashboard shows its text
        self.latest = self.base  # what the dashboard draws; replaced whole by `refresh`

    def record(self, row: dict[str, Any], staleness: list[int] | None = None,
               sample: dict[str, Any] | None = None) -> None:
        """A step's metrics row, its samples' staleness and its latest sample row (on the loop's thread)."""
        self.last_row = row
        if sample is not None:
            self.last_sample = sample
        if row.get("eval_pass_rate") is not None:
            self.evals.append((row["step"], row["eval_pass_rate"]))
        if row.get("reward_mean") is None:  # the step-0 evaluation row
            return
        self.rewards.append(row["reward_mean"])
        self.gen_busy.append(1.0 - row.get("gen_idle_frac", 0.0))
        self.train_busy.append(1.0 - row.get("train_idle_frac", 0.0))
        if staleness is not None:
            self.staleness.append(Counter(staleness))
        self.step_times.append((row["step"], time.monotonic()))

    def _eta(self, step: int, total: int) -> float | None:
        if len(self.step_times) < 2 or step >= total:
            return None if step < total else 0.0
        (s0, t0), (s1, t1) = self.step_times[0], self.step_times[-1]
        return (total - step) * (t1 - t0) / (s1 - s0) if s1 > s0 else None

    def refresh(self, counters: dict[str, int] | None = None) -> Snapshot:
        """Build the snapshot (on the event loop's thread) from the recorded rows and the
        orchestrator's `live_counters()`, and publish it as `latest`."""
        if counters is not None:
            self.counters = counters
        self.latest = self._build()
        return self.latest

    async def keep_fresh(self, counters: Callable[[], dict[str, int]], every_s: float = 0.25) -> None:
        """Refresh `latest` every `every_s` seconds until cancelled (run it on the event loop)."""
        while True:
            self.refresh(counters())
            await asyncio.sleep(every_s)

    def _build(self) -> Snapshot:
        row = self.last_row
        snap = Snapshot(**{**self.base.__dict__})
        snap.elapsed = time.monotonic() - self.started
        snap.step = row.get("step", 0)
        snap.eta = self._eta(snap.step, snap.steps_total)
        for key in ("gen_tokens_per_s", "train_tokens_per_s", "samples_per_s"):
            setattr(snap, key, row.get(key) or 0.0)
        for key in ("loss", "kl", "grad_norm", "clip_frac", "behav_weight_mean", "behav_weight_max", "capped_frac",
                    "logprob_gap_mean", "logprob_gap_max"):
            setattr(snap, key, row.get(key))
        sample = self.last_sample
        snap.completion, snap.completion_reward = sample.get("text"), sample.get("reward")
        snap.completion_prompt = sample.get("prompt")
        snap.completion_step = sample.get("step", 0)
        snap.episode = {k: row[k] for k in EPISODE_KEYS if row.get(k) is not None}
        snap.dropped_stale = row.get("groups_dropped_stale", 0)
        snap.rejected = row.get("groups_rejected", 0)
        snap.reward_failures = row.get("reward_failures", 0)
        snap.rewards, snap.evals = list(self.rewards), list(self.evals)
        snap.gen_busy, snap.train_busy = list(self.gen_busy), list(self.train_busy)
        snap.gen_busy_ranks, snap.train_busy_ranks = row.get("gen_busy_ranks", []), row.get("train_busy_ranks", [])
        snap.staleness_hist = dict(sum(self.staleness, Counter()))
        for key, value in self.counters.items():  # trainer/generator version, groups running/ready
            setattr(snap, key, value)
        snap.train_phases = {k[5:]: v for k, v in row.items()
                             if k.startswith("time_") and not k.startswith("time_gen_")}
        snap.gen_phases = {k[9:]: v for k, v in row.items() if k.startswith("time_gen_")}
        snap.gpu_memory = [(str(d), torch.cuda.memory_allocated(d) / 2**30,
                            torch.cuda.get_device_properties(d).total_memory / 2**30) for d in self.cuda_devices]
        return snap
