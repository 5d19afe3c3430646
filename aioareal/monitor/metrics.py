"""Run outputs: metrics.jsonl (one row per training step), samples.jsonl (one row per trained
sample) and eval_samples.jsonl (one row per held-out completion per evaluation). Rows are appended
in single writes and flushed; a resumed run first drops a torn last line and any rows past its
checkpoint, so no step is ever logged twice."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

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
