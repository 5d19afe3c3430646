"""What a run records of each step, and where: the `StepReport` the orchestrator hands its hooks
(the metrics row, `step_row`, and the trained samples' rows, `sample_rows`), and `RunLog`, which
appends them to metrics.jsonl (one row per training step), samples.jsonl (one row per trained sample)
and eval_samples.jsonl (one row per held-out completion per evaluation).

The row and sample names are a public contract: the plot, report, samples and dashboard commands
read them. Rows are appended in single writes and flushed; a resumed run first drops a torn last
line and any rows past its checkpoint, so no step is ever logged twice.

The dashboard's live state sits at the end (`LiveState`, `Snapshot`): a snapshot built on the event
loop, read from rich's thread. The run `record`s each step's metrics row (histories live here,
bounded) and, a few times a second, `refresh`es the snapshot with the orchestrator's live counters
(versions, queue depths), all on the event loop's thread. The dashboard's refresh thread only reads
`latest`, a finished `Snapshot` swapped in whole: it never iterates a deque the loop is changing, and
takes no lock the loop could wait on."""
from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, pstdev
from typing import Any

import torch

from ..checkpoint import RunState
from ..group import MODEL, Group, Sample
from ..io import append_jsonl, open_append, refuse_odd, repair_jsonl

METRICS_FILE, SAMPLES_FILE, EVAL_SAMPLES_FILE = "metrics.jsonl", "samples.jsonl", "eval_samples.jsonl"


def clean(row: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN/inf: write them as null."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _step(row: dict[str, Any]) -> int:
    step = row.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"'step' must be an integer, got {step!r}")
    return step


class RunLog:
    def __init__(self, run_dir: str | Path, resume_step: int | None = None) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path, self.samples_path = self.dir / METRICS_FILE, self.dir / SAMPLES_FILE
        self.eval_samples_path = self.dir / EVAL_SAMPLES_FILE
        paths = (self.metrics_path, self.samples_path, self.eval_samples_path)
        if resume_step is not None:
            keep = lambda row: _step(row) <= resume_step  # noqa: E731
            for path in paths:
                refuse_odd(path)  # a planted link or FIFO is neither read through nor appended to
                repair_jsonl(path, keep)
        else:
            for path in paths:
                path.unlink(missing_ok=True)  # a link itself goes, its target untouched
        self._metrics, self._samples, self._eval_samples = (open_append(path) for path in paths)

    def step(self, row: dict[str, Any]) -> None:
        append_jsonl(self._metrics, [clean(row)])

    def samples(self, rows: list[dict[str, Any]]) -> None:
        append_jsonl(self._samples, [clean(r) for r in rows])

    def eval_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        """One evaluation's completions, each under the step it evaluated (one write)."""
        append_jsonl(self._eval_samples, [clean({"step": step, **r}) for r in rows])

    def close(self) -> None:
        self._metrics.close()
        self._samples.close()
        self._eval_samples.close()


@dataclass
class StepReport:
    """One training step (or the step-0 evaluation, with no groups), as numbers."""

    step: int
    row: dict[str, Any]  # the metrics.jsonl row
    samples: list[dict[str, Any]]  # the samples.jsonl rows of the trained groups
    groups: list[Group]
    state: RunState  # the counters a checkpoint taken after this step holds

    @property
    def staleness(self) -> list[int]:
        return [s["staleness"] for s in self.samples]


@dataclass
class Clocks:
    """Running totals the orchestrator keeps; a row reports the change since the previous row."""

    time: float = 0.0
    gen_busy: float = 0.0
    train_busy: float = 0.0
    tokens: int = 0
    gen_phases: dict[str, float] = field(default_factory=dict)  # seconds per generator phase


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def step_row(step: int, trained_version: int, groups: list[Group], metrics: dict[str, float],
             train_seconds: float, before: Clocks, now: Clocks, counters: dict[str, Any]) -> dict[str, Any]:
    """Metrics of one step since the previous row; `counters`: the orchestrator's versions and ledger."""
    wall = now.time - before.time
    gen_busy, train_busy = now.gen_busy - before.gen_busy, now.train_busy - before.train_busy
    samples = [s for g in groups for s in g.samples]
    staleness = [s.staleness(trained_version) for s in samples]
    rewards = [s.reward for s in samples]
    return {
        "step": step,
        **{k: counters[k] for k in ("version", "gen_version")},
        "time": now.time,
        "reward_mean": fmean(rewards),
        "reward_std": pstdev(rewards),
        "response_len_mean": fmean(len(s.tokens) for s in samples),
        # Completions cut off by the length limit (generation.max_new_tokens or the context), not ended by EOS.
        "clipped_frac": fmean(s.completion.finish_reason == "length" for s in samples),
        "staleness_mean": fmean(staleness),
        "staleness_max": max(staleness),
        "dropped_stale": counters["dropped_stale"],
        # Per second of generator busy time: wall-clock rates would mix in an overlapping evaluation.
        "gen_tokens_per_s": _ratio(now.tokens - before.tokens, gen_busy),
        "train_tokens_per_s": _ratio(metrics.get("train_tokens", 0), train_seconds),
        "samples_per_s": _ratio(len(samples), wall),
        # Busy time can exceed the wall time by the clocks' granularity: clamp the idle share at 0.
        "gen_idle_frac": max(0.0, 1.0 - _ratio(gen_busy, wall)),
        "train_idle_frac": max(0.0, 1.0 - _ratio(train_busy, wall)),
        **{k: v for k, v in counters.items() if k.startswith(("groups_", "reward_", "reward/", "episode_", "tool_"))},
        **episode_figures(samples),
        **metrics,
        **{f"time_gen_{phase}": now.gen_phases.get(phase, 0.0) - before.gen_phases.get(phase, 0.0)
           for phase in now.gen_phases},
    }


def episode_figures(samples: list[Sample]) -> dict[str, float]:
    """Episodes' figures of a step (none for single completions): turns, tool calls, tokens."""
    if not any(s.completion.turns for s in samples):
        return {}
    calls = [call for s in samples for call in s.completion.tool_calls]
    obs = [s.completion.obs_tokens for s in samples]
    return {"turns_mean": fmean(sum(t.role == MODEL for t in s.completion.turns) for s in samples),
            "tool_calls": len(calls), "tool_errors": sum(c.error is not None for c in calls),
            "tool_latency_mean": fmean(c.seconds for c in calls) if calls else 0.0,
            "obs_tokens_mean": fmean(obs), "model_tokens_mean": fmean(len(s.tokens) - o for s, o in zip(samples, obs))}


PROMPT_TEXT_CHARS = 500  # a longer prompt is left out of the sample rows: find it by its prompt_id


def clip_text(text: str | None, limit: int) -> str | None:
    """The first `limit` characters of `text`, then "…" where it was cut; None for limit 0 (no text)."""
    if text is None or limit == 0:
        return None
    return text if len(text) <= limit else text[:limit] + "…"


def sample_rows(step: int, trained_version: int, groups: list[Group], now: float,
                text_chars: int = 0) -> list[dict[str, Any]]:
    """One samples.jsonl row per trained sample: what the model wrote (cut at `text_chars`), to which
    prompt (`prompt_id`; `prompt` when short), and what it earned."""
    return [{
        "step": step,
        "group_id": g.group_id,
        "version_min": s.version_min,
        "version_max": s.version_max,
        "staleness": s.staleness(trained_version),
        "reward": s.reward,
        "advantage": s.advantage,
        "length": len(s.tokens),
        "finish_reason": s.completion.finish_reason,
        "admitted_at": g.admitted_at,
        "finished_at": g.finished_at,
        "trained_at": now,
        "prompt_id": g.example.uid if g.example else None,
        "prompt": _short_prompt(g, text_chars),
        "text": clip_text(s.completion.text, text_chars),
        **_turns(s, text_chars),
    } for g in groups for s in g.samples]


def _turns(sample: Sample, text_chars: int) -> dict[str, Any]:
    """An episode's turns, each with its role and text (cut like `text`), and its tool calls."""
    c = sample.completion
    if not c.turns:
        return {}
    return {"turns": [{"role": t.role, "text": clip_text(t.text, text_chars)} for t in c.turns],
            "tool_calls": [{"name": t.name, "seconds": round(t.seconds, 4), "error": t.error} for t in c.tool_calls]}


def _short_prompt(group: Group, text_chars: int) -> str | None:
    prompt = group.example.prompt if group.example else None
    return prompt if prompt is not None and len(prompt) <= min(text_chars, PROMPT_TEXT_CHARS) else None


# -- the dashboard's live state -----------------------------------------------------------------------
# The episodes' figures of a step row the dashboard shows (`episode_figures` above).
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
