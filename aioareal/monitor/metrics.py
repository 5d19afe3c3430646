"""What a run records of each step, and where: the `StepReport` the orchestrator hands its hooks
(the metrics row, `step_row`, and the trained samples' rows, `sample_rows`), and `RunLog`, which
appends them to metrics.jsonl (one row per training step), samples.jsonl (one row per trained sample)
and eval_samples.jsonl (one row per held-out completion per evaluation).

The row and sample names are a public contract: the plot, report, samples and dashboard commands
read them. Rows are appended in single writes and flushed; a resumed run first drops a torn last
line and any rows past its checkpoint, so no step is ever logged twice."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, pstdev
from typing import Any

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
