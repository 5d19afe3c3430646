"""The sweep's table (one row per configuration, means over seeds) and report.md with the figures.

Definitions, per run, then averaged over the configuration's seeds:
  final / best pass rate   the last / highest held-out evaluation in metrics.jsonl
  time to threshold        `time` of the first evaluation with pass rate >= threshold; the mean is
                           over the seeds that reached it (n_reached says how many), NaN if none
  samples to threshold     trained samples by that step: step * batch_groups * group_size
  samples/s                trained samples by the last step / `time` of the last row
  mean staleness           over trained samples in samples.jsonl; without one, the mean of the
                           per-step staleness_mean (every step trains the same number of samples)
  dropped fraction         groups_dropped_stale / groups_admitted at the last row
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ...io import atomic_write_text
from .distributions import distribution_sections
from .eval_trace import eval_trace_section
from .load import Run, by_configuration, choose_threshold, load_runs
from .plots import FILES, plot_runs

COLUMNS = {  # summarise() column -> (table header, format)
    "configuration": ("configuration", "{}"), "n_seeds": ("seeds", "{:d}"),
    "final_pass_rate": ("final pass rate", "{:.3f}"), "final_range": ("final, min-max over seeds", "{}"),
    "best_pass_rate": ("best pass rate", "{:.3f}"),
    "time_to_threshold_s": ("time to threshold (s)", "{:.1f}"), "n_reached": ("seeds reaching it", "{:d}"),
    "samples_to_threshold": ("samples to threshold", "{:,.0f}"), "samples_per_s": ("samples/s", "{:.1f}"),
    "mean_staleness": ("mean staleness", "{:.2f}"), "dropped_frac": ("dropped (stale)", "{:.1%}"),
}
CAPTIONS = dict(zip(FILES, ("Held-out pass rate vs training step", "Held-out pass rate vs wall clock",
                            "Time to threshold", "Staleness distribution", "Throughput and idle time",
                            "Training reward", "Off-policy diagnostics")))
DIAGNOSTICS = {  # metrics.jsonl column -> (header, format, last N steps only or None for all)
    "stale_token_frac": ("stale tokens", "{:.1%}", None), "behav_weight_mean": ("mean w", "{:.3f}", None),
    "behav_weight_max": ("max w (per step)", "{:.2f}", None),
    "behav_outside_clip_frac": ("w outside clip range", "{:.1%}", None), "clip_frac": ("clipped", "{:.1%}", None),
    "capped_frac": ("capped", "{:.2%}", None), "capped_neg_frac": ("capped, A < 0", "{:.2%}", None),
    "entropy": ("entropy", "{:.3f}", None),
    "entropy_end": ("entropy, last 10 steps", "{:.3f}", 10),
}


def run_summary(run: Run, threshold: float) -> dict[str, float]:
    """The table's measures for one run (see the module docstring)."""
    evals, m = run.evals(), run.metrics
    hit = None if math.isnan(threshold) else run.first_reaching(threshold)
    last = m.iloc[-1]
    trained = float(last["step"]) * run.samples_per_step
    ledger = m.dropna(subset=["groups_admitted"]) if "groups_admitted" in m else m.iloc[:0]
    admitted = float(ledger["groups_admitted"].iloc[-1]) if len(ledger) else 0.0
    return {
        "final_pass_rate": run.final_pass_rate,
        "best_pass_rate": float(evals["eval_pass_rate"].max()) if len(evals) else math.nan,
        "reached": hit is not None,
        "time_to_threshold_s": float(hit["time"]) if hit is not None else math.nan,
        "samples_to_threshold": float(hit["step"]) * run.samples_per_step if hit is not None else math.nan,
        "samples_per_s": trained / float(last["time"]) if last["time"] > 0 else math.nan,
        "mean_staleness": mean_staleness(run),
        "dropped_frac": float(ledger["groups_dropped_stale"].iloc[-1]) / admitted if admitted > 0 else math.nan,
    }


def mean_staleness(run: Run) -> float:
    if "staleness" in run.samples and run.samples["staleness"].notna().any():
        return float(run.samples["staleness"].mean())
    if "staleness_mean" in run.metrics:
        return float(run.metrics.loc[run.metrics["step"] > 0, "staleness_mean"].mean())
    return math.nan


def summarise(runs: list[Run], threshold: float | None) -> pd.DataFrame:
    """One row per configuration: the measures averaged over its seeds, plus n_seeds and n_reached."""
    threshold, _ = choose_threshold(runs, threshold)
    rows = []
    for label, group in by_configuration(runs).items():
        per_run = pd.DataFrame([run_summary(r, threshold) for r in group])
        means = per_run.drop(columns="reached").mean()  # NaN-skipping: time/samples over seeds that reached
        finals = per_run["final_pass_rate"]
        rows.append({"configuration": label, "n_seeds": len(group), **means.to_dict(),
                     "final_range": f"{finals.min():.3f}-{finals.max():.3f}",
                     "n_reached": int(per_run["reached"].sum())})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def diagnostics(groups: dict[str, list[Run]]) -> pd.DataFrame:
    """One row per configuration: each DIAGNOSTICS metric averaged over training steps, then seeds
    (columns no run has are left out: older runs, or objectives that do not log them)."""
    rows = []
    for label, runs in groups.items():
        row: dict[str, object] = {"configuration": label}
        for key, (_, _, last) in DIAGNOSTICS.items():
            name = key.removesuffix("_end")
            per_run = [float(m.loc[m["step"] > 0, name].tail(last or len(m)).mean())
                       for m in (r.metrics for r in runs) if name in m]
            row[key] = sum(per_run) / len(per_run) if per_run else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    return table[[c for c in table if c == "configuration" or table[c].notna().any()]]


def diagnostics_section(groups: dict[str, list[Run]]) -> list[str]:
    diag = diagnostics(groups)
    if len(diag.columns) == 1:
        return []
    return ["", "## Off-policy diagnostics", "",
            markdown_table(diag, {"configuration": ("configuration", "{}"), **DIAGNOSTICS}), "",
            "Means over training steps, then seeds. w: the behaviour weight, pi_prox / pi_behav for decoupled "
            "(the weight it applies), pi / pi_behav for ppo (its ratio) and dg (which does not use it); "
            "clip range [1 - clip_eps_low, 1 + clip_eps_high]. Clipped: tokens the clip leaves without "
            "gradient. Capped: decoupled tokens with w over algo.behav_cap (A < 0: those with a negative advantage)."]


def markdown_table(table: pd.DataFrame, columns: dict | None = None) -> str:
    """A GitHub markdown table (pandas' to_markdown needs tabulate, which we do not depend on)."""
    columns = columns or COLUMNS
    cols = [c for c in columns if c in table]
    lines = ["| " + " | ".join(columns[c][0] for c in cols) + " |",
             "|" + "|".join("---" if c == "configuration" else "---:" for c in cols) + "|"]
    for _, row in table.iterrows():
        cells = [_cell(row[c], columns[c][1]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: object, fmt: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "–"
    return fmt.format(value).replace("|", "\\|")


def describe(label: str, runs: list[Run], row: pd.Series, threshold: float) -> str:
    r0 = runs[0]
    seeds = ", ".join(str(r.setting("run.seed")) for r in runs)
    finals = [r.final_pass_rate for r in runs]
    parts = [f"rollout mode `{r0.setting('rollout.mode')}`, K={r0.setting('rollout.max_staleness')}, "
             f"objective `{r0.setting('algo.objective')}`; {r0.setting('train.steps')} steps of "
             f"{r0.setting('algo.batch_groups')} groups x {r0.setting('algo.group_size')} samples",
             f"{len(runs)} seed(s) ({seeds})",
             f"final pass rate {_cell(row['final_pass_rate'], '{:.3f}')} "
             f"(seeds {_cell(min(finals), '{:.3f}')} to {_cell(max(finals), '{:.3f}')})"]
    partial = [f"{r.name} stopped at step {r.last_step}" for r in runs if not r.complete]
    if partial:
        parts.append("**incomplete**: " + ", ".join(partial) + " (its numbers are in the means)")
    if row["n_reached"]:
        parts.append(f"reached {threshold:.3f} in {row['n_reached']}/{len(runs)} seeds after "
                     f"{row['time_to_threshold_s']:.1f} s and {row['samples_to_threshold']:,.0f} samples on average")
    else:
        parts.append(f"never reached {threshold:.3f}")
    parts.append(f"mean staleness {_cell(row['mean_staleness'], '{:.2f}')}, "
                 f"{_cell(row['samples_per_s'], '{:.1f}')} samples/s")
    return f"- **{label}**: " + "; ".join(parts) + "."


def write_report(path: str | Path, out_dir: str | Path, threshold: float | None = None) -> Path:
    """Write out_dir/report.md (and the figures it embeds); return the report's path."""
    runs = load_runs(path)
    value, how = choose_threshold(runs, threshold)
    figures = plot_runs(runs, out_dir, threshold)
    table = summarise(runs, value)
    groups = by_configuration(runs)
    name = Path(path).resolve().name
    # A hand-written findings.md next to the report (what the figures show) is kept at its top.
    findings = Path(out_dir) / "findings.md"
    written = [findings.read_text(encoding="utf-8").strip(), ""] if findings.is_file() else []
    lines = [f"# Report: {name}", "", *written]
    lines += [f"{len(runs)} run(s) in {len(groups)} configuration(s), read from `{path}`; "
              f"{sum(not r.complete for r in runs)} incomplete (no `DONE` file and fewer than train.steps steps).", "",
              f"**Threshold**: held-out pass rate {value:.3f} ({how}).", "",
              markdown_table(table), "",
              "Means over seeds. Time and samples to threshold: first evaluation at or above the threshold, "
              "averaged over the seeds that reached it; samples = step x batch_groups x group_size. "
              "Samples/s: trained samples / wall-clock time of the last step. Dropped: stale groups / admitted "
              "groups.", "", "## Configurations", ""]
    lines += [describe(label, groups[label], row, value) for label, (_, row) in zip(groups, table.iterrows())]
    lines += eval_trace_section(groups)
    lines += distribution_sections(groups)
    lines += diagnostics_section(groups)
    lines += ["", "## Figures", ""]
    for fig in figures:
        lines += [f"### {CAPTIONS[fig.name]}", "", f"![{CAPTIONS[fig.name]}]({fig.name})", ""]
    out = Path(out_dir) / "report.md"
    atomic_write_text(out, "\n".join(lines))
    return out
