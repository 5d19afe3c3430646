"""Two report tables the figures only draw: how stale the trained samples were, and how busy each
side was, per configuration with the spread over seeds.

  staleness distribution   fraction of a configuration's trained samples (samples.jsonl, all seeds
                           pooled) at each staleness 0, 1, ..., MAX_COLUMN, and above it; the mean per
                           seed as min-max, so a K that never fills shows as such (K=8 with mean 0.9)
  idle and throughput      gen_idle_frac / train_idle_frac averaged over training steps, and samples/s
                           (trained samples / time of the last row): mean over seeds and min-max
"""
from __future__ import annotations

import math

import pandas as pd

from .load import Run

MAX_COLUMN = 8  # staleness columns 0..8, then one for everything above


def staleness_table(groups: dict[str, list[Run]]) -> pd.DataFrame:
    """One row per configuration with samples.jsonl rows: n samples, fraction at each staleness."""
    rows = []
    for label, runs in groups.items():
        per_run = [r.samples["staleness"].dropna().astype(int) for r in runs if "staleness" in r.samples]
        per_run = [s for s in per_run if len(s)]
        if not per_run:
            continue
        pooled = pd.concat(per_run)
        means = [float(s.mean()) for s in per_run]
        row: dict[str, object] = {"configuration": label, "samples": len(pooled),
                                  "mean": f"{sum(means) / len(means):.2f} ({min(means):.2f}-{max(means):.2f})",
                                  "max": int(pooled.max())}
        for k in range(MAX_COLUMN + 1):
            row[str(k)] = float((pooled == k).mean())
        row[f">{MAX_COLUMN}"] = float((pooled > MAX_COLUMN).mean())
        rows.append(row)
    return pd.DataFrame(rows)


def idle_table(groups: dict[str, list[Run]]) -> pd.DataFrame:
    """One row per configuration: idle fractions and samples/s, mean and min-max over seeds."""
    rows = []
    for label, runs in groups.items():
        row: dict[str, object] = {"configuration": label}
        for name in ("gen_idle_frac", "train_idle_frac"):
            row[name] = _spread([float(r.metrics.loc[r.metrics["step"] > 0, name].mean())
                                 for r in runs if name in r.metrics], "{:.0%}")
        row["samples_per_s"] = _spread([_samples_per_s(r) for r in runs], "{:.2f}")
        rows.append(row)
    return pd.DataFrame(rows)


def _samples_per_s(run: Run) -> float:
    last = run.metrics.iloc[-1]
    return float(last["step"]) * run.samples_per_step / float(last["time"]) if last["time"] > 0 else math.nan


def _spread(values: list[float], fmt: str) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    mean = fmt.format(sum(values) / len(values))
    return mean if len(values) == 1 else f"{mean} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def distribution_sections(groups: dict[str, list[Run]]) -> list[str]:
    """The report's lines for both tables (the staleness one only where samples.jsonl has rows)."""
    lines: list[str] = []
    stale = staleness_table(groups)
    if len(stale):
        header = ["configuration", "samples", "mean (min-max over seeds)", "max",
                  *[str(k) for k in range(MAX_COLUMN + 1)], f">{MAX_COLUMN}"]
        lines += ["", "## Staleness distribution", "", markdown_grid(stale, header, pct_from=4), "",
                  "Fraction of trained samples at each staleness (policy versions behind the trainer when "
                  "trained), all seeds pooled; the mean per seed as min-max."]
    idle = idle_table(groups)
    lines += ["", "## Idle time and throughput", "",
              markdown_grid(idle, ["configuration", "generator idle", "trainer idle", "samples/s"]), "",
              "Means over training steps, then seeds (min-max over seeds in brackets)."]
    return lines


def markdown_grid(table: pd.DataFrame, header: list[str], pct_from: int | None = None) -> str:
    """A markdown table of `table`'s rows under `header`; columns from `pct_from` on as percentages."""
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for _, row in table.iterrows():
        cells = [f"{v:.1%}" if pct_from is not None and i >= pct_from else str(v) for i, v in enumerate(row)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
