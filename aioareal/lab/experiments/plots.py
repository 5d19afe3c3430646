"""Figures of a sweep: one line per configuration, the mean over its seeds with a min-max band.

Seeds are aligned by step; for wall-clock plots each seed is interpolated onto a common time grid
that ends with the slowest seed, a seed that ended sooner holding its final value (its final
policy's pass rate) so the mean does not jump when the fastest seed stops. Noisy per-step series
(reward, throughput) are smoothed with a rolling mean whose window the title states. Figures are drawn on
`matplotlib.figure.Figure` objects directly (Agg canvas), so no display or pyplot state is needed.
"""
from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps, cycler, rc_context
from matplotlib.figure import Figure

from ...io import atomic_write_bytes
from .load import Run, by_configuration, choose_threshold, load_runs

FILES = ("pass_rate_vs_step.png", "pass_rate_vs_time.png", "time_to_threshold.png", "staleness.png",
         "throughput.png", "reward.png", "off_policy.png")
TIME_POINTS = 200
THROUGHPUT = (("gen_tokens_per_s", "generation tokens/s (busy time)"), ("train_tokens_per_s", "training tokens/s"),
              ("gen_idle_frac", "generator idle fraction"), ("train_idle_frac", "trainer idle fraction"))
# What the objectives do with stale tokens (trainer metrics; see docs/outputs.md).
OFF_POLICY = (("behav_weight_mean", "mean behaviour weight w"), ("behav_weight_max", "max behaviour weight w"),
              ("behav_outside_clip_frac", "tokens with w outside [1-eps, 1+eps]"),
              ("clip_frac", "tokens clipped (no gradient)"), ("capped_frac", "decoupled: tokens over behav_cap"),
              ("entropy", "policy entropy (nats/token)"))


def plot_sweep(path: str | Path, out_dir: str | Path, threshold: float | None = None) -> list[Path]:
    """Write the sweep's PNGs to out_dir and return their paths."""
    return plot_runs(load_runs(path), out_dir, threshold)


# Ten colours solid, then the same ten dashed and dotted: the default cycle repeats its ten colours
# from the eleventh configuration on, and a study sweep has more (issue 38's has 16).
LINES = cycler(linestyle=["-", "--", ":"]) * cycler(color=list(colormaps["tab10"].colors))


def plot_runs(runs: list[Run], out_dir: str | Path, threshold: float | None = None) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = by_configuration(runs)
    paths = []
    for name, fig in zip(FILES, draw_figures(groups, *choose_threshold(runs, threshold))):
        if all(len(g) == 1 for g in groups.values()):
            one_seed_titles(fig)
        # Drawn in memory, then written whole by rename: a killed plot leaves the last PNG, and a link
        # planted at its name is replaced, never followed.
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
        atomic_write_bytes(out / name, png.getvalue())
        paths.append(out / name)
    return paths


SEED_WORDS = (("mean, band: min-max over seeds; ", ""), (" (mean, band: min-max over seeds)", ""),
              ("mean over seeds; ", ""), (" (mean over the seeds that reached it; whiskers: min-max)", ""),
              (" (mean, band: min-max over seeds", " ("))


def one_seed_titles(fig: Figure) -> None:
    """Titles of figures whose every configuration is one run: no mean, band or whiskers over seeds."""
    texts = [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle is not None else [])
    for text in texts:
        title = text.get_text()
        for words, instead in SEED_WORDS:
            title = title.replace(words, instead)
        text.set_text(title.replace("()", "").strip())


def draw_figures(groups: dict[str, list[Run]], value: float, how: str) -> tuple[Figure, ...]:
    """The report's figures, in FILES order, every configuration on a line style of its own (LINES)."""
    with rc_context({"axes.prop_cycle": LINES}):  # read when each figure's axes are made
        return (pass_rate_vs_step(groups), pass_rate_vs_time(groups), time_to_threshold(groups, value, how),
                staleness(groups), throughput(groups), reward(groups), off_policy(groups))


# -- aggregation over seeds ----------------------------------------------------------------------
def across_seeds(series: list[pd.Series]) -> pd.DataFrame:
    """Series sharing an index (step or time) -> mean, lo, hi and n over the seeds present at each point."""
    series = [s for s in series if len(s)]
    if not series:
        return pd.DataFrame(columns=["mean", "lo", "hi", "n"], dtype=float)
    table = pd.concat(series, axis=1)
    return pd.DataFrame({"mean": table.mean(axis=1), "lo": table.min(axis=1), "hi": table.max(axis=1),
                         "n": table.count(axis=1)}).dropna(subset=["mean"]).sort_index()


def on_time_grid(points: list[tuple[np.ndarray, np.ndarray]], n: int = TIME_POINTS) -> list[pd.Series]:
    """(time, value) pairs per seed -> series on one shared time grid; NaN before a seed starts, its last
    value after it ends."""
    points = [(t, v) for t, v in points if len(t)]
    if not points:
        return []
    grid = np.linspace(min(t[0] for t, _ in points), max(t[-1] for t, _ in points), n)
    return [pd.Series(np.interp(grid, t, v, left=np.nan, right=v[-1]), index=grid) for t, v in points]


def smoothing_window(runs: list[Run]) -> int:
    return max(1, int(max(r.metrics["step"].max() for r in runs)) // 40)


def column(run: Run, name: str, window: int = 1) -> pd.Series:
    """A metrics column by step, training steps only, rolling-mean smoothed."""
    if name not in run.metrics:
        return pd.Series(dtype=float)
    s = run.metrics[run.metrics["step"] > 0].set_index("step")[name].dropna()
    return s.rolling(window, min_periods=1).mean()


def draw(ax, stats: pd.DataFrame, label: str) -> None:
    (line,) = ax.plot(stats.index, stats["mean"], label=label, lw=1.6)
    if (stats["n"] > 1).any():
        ax.fill_between(stats.index, stats["lo"], stats["hi"], color=line.get_color(), alpha=0.18, lw=0)


def figure(title: str, xlabel: str, ylabel: str, size: tuple[float, float] = (7.5, 4.5)):
    fig = Figure(figsize=size, layout="constrained")
    ax = fig.subplots()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def legend(fig: Figure, ax) -> None:
    """One legend under the plot, where it covers no curve."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ncol = 1 if max(map(len, labels)) > 45 else min(3, len(labels))
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize="small", frameon=False)


# -- figures -------------------------------------------------------------------------------------
def pass_rate_vs_step(groups: dict[str, list[Run]]) -> Figure:
    fig, ax = figure("Held-out pass rate (mean, band: min-max over seeds)", "training step", "pass rate")
    for label, runs in groups.items():
        series = [r.evals().set_index("step")["eval_pass_rate"] for r in runs]
        draw(ax, across_seeds(series), label)
    legend(fig, ax)
    return fig


def pass_rate_vs_time(groups: dict[str, list[Run]]) -> Figure:
    fig, ax = figure("Held-out pass rate vs wall clock (mean, band: min-max over seeds)", "seconds", "pass rate")
    for label, runs in groups.items():
        pairs = [(e["time"].to_numpy(), e["eval_pass_rate"].to_numpy()) for e in (r.evals() for r in runs)]
        series = on_time_grid(pairs)
        if series:
            draw(ax, across_seeds(series), label)
    legend(fig, ax)
    return fig


def time_to_threshold(groups: dict[str, list[Run]], threshold: float, how: str) -> Figure:
    fig, ax = figure(f"Time to held-out pass rate >= {threshold:.3f}\n" + textwrap.fill(f"({how})", 90),
                     "seconds (mean over the seeds that reached it; whiskers: min-max)", "",
                     size=(9.0, 1.5 + 0.55 * len(groups)))
    for i, runs in enumerate(groups.values()):  # labels: the y ticks below
        hits = [] if math.isnan(threshold) else [r.first_reaching(threshold) for r in runs]
        times = [float(h["time"]) for h in hits if h is not None]
        mean = float(np.mean(times)) if times else 0.0
        if times:
            ax.barh(i, mean, xerr=[[mean - min(times)], [max(times) - mean]], capsize=4, color=f"C{i % 10}")
        note = f"  {len(times)}/{len(runs)} seeds" if times else "  not reached"
        ax.annotate(note, (max(times, default=0.0), i), va="center", fontsize="small")
    ax.set_yticks(range(len(groups)), list(groups), fontsize="small")
    ax.invert_yaxis()  # first configuration on top, as in the legends and the report
    ax.margins(x=0.15)
    return fig


def staleness(groups: dict[str, list[Run]]) -> Figure:
    fig, ax = figure("Staleness of trained samples (fraction of each configuration's samples)",
                     "staleness (policy versions)", "fraction of samples")
    dists = {}
    for label, runs in groups.items():
        values = pd.concat([r.samples["staleness"].dropna() for r in runs if "staleness" in r.samples] or
                           [pd.Series(dtype=float)])
        if len(values):
            dists[label] = values.astype(int).value_counts(normalize=True).sort_index()
    if not dists:
        ax.annotate("no samples.jsonl rows", (0.5, 0.5), xycoords="axes fraction", ha="center")
    width = 0.8 / max(1, len(dists))
    for i, (label, dist) in enumerate(dists.items()):
        ax.bar(dist.index + (i - (len(dists) - 1) / 2) * width, dist.to_numpy(), width=width, label=label)
    if dists:
        ax.set_xticks(range(int(max(d.index.max() for d in dists.values())) + 1))
    legend(fig, ax)
    return fig


def throughput(groups: dict[str, list[Run]]) -> Figure:
    fig = Figure(figsize=(11, 7), layout="constrained")
    axes = fig.subplots(2, 2, sharex=True).ravel()
    window = smoothing_window([r for runs in groups.values() for r in runs])
    fig.suptitle(f"Throughput over time (mean over seeds; rolling mean over {window} steps)")
    for ax, (name, title) in zip(axes, THROUGHPUT):
        ax.set(title=title, xlabel="seconds" if ax in axes[2:] else "")
        ax.grid(alpha=0.3)
        for label, runs in groups.items():
            values = across_seeds([column(r, name, window) for r in runs])
            times = across_seeds([column(r, "time") for r in runs])["mean"].reindex(values.index)
            if len(values):
                ax.plot(times.to_numpy(), values["mean"].to_numpy(), label=label, lw=1.4)
    legend(fig, axes[0])
    return fig


def reward(groups: dict[str, list[Run]]) -> Figure:
    window = smoothing_window([r for runs in groups.values() for r in runs])
    fig, ax = figure(f"Training reward (mean, band: min-max over seeds; rolling mean over {window} steps)",
                     "training step", "reward_mean")
    for label, runs in groups.items():
        stats = across_seeds([column(r, "reward_mean", window) for r in runs])
        if len(stats):
            draw(ax, stats, label)
    legend(fig, ax)
    return fig


def off_policy(groups: dict[str, list[Run]]) -> Figure:
    """One panel per OFF_POLICY metric vs step; a configuration without the metric draws nothing."""
    fig = Figure(figsize=(13, 7.5), layout="constrained")
    axes = fig.subplots(2, 3, sharex=True).ravel()
    window = smoothing_window([r for runs in groups.values() for r in runs])
    fig.suptitle(f"Off-policy diagnostics (mean, band: min-max over seeds; rolling mean over {window} steps)")
    for i, (ax, (name, title)) in enumerate(zip(axes, OFF_POLICY)):
        ax.set(title=title, xlabel="training step" if i >= 3 else "")
        ax.grid(alpha=0.3)
        for label, runs in groups.items():
            stats = across_seeds([column(r, name, window) for r in runs])
            if len(stats):
                draw(ax, stats, label)
            else:  # keep each configuration's colour the same in every panel
                ax.plot([], [], label=label)
    legend(fig, axes[0])
    return fig
