"""The plot `simulate` writes: predicted speedup over sync against K (one-step drawn at K = 1),
and the mean staleness and interrupted share that buy it."""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from .contention import Topology
from .cost_profile import Profile
from .simulated_run import Result


def plot_speedup(results: list[Result], profile: Profile, topology: Topology, lengths: str, path: Path) -> None:
    sync = results[0].samples_per_s
    asyncs = [r for r in results if r.mode == "async"]
    fig = Figure(figsize=(10, 4))  # drawn on its own Agg canvas: no display, no pyplot state
    left, right = fig.subplots(1, 2)
    if asyncs:
        left.plot([r.k for r in asyncs], [r.samples_per_s / sync for r in asyncs], "o-", label="async")
        right.plot([r.k for r in asyncs], [r.staleness_mean for r in asyncs], "o-", label="mean staleness")
        right.plot([r.k for r in asyncs], [r.interrupted for r in asyncs], "s--", label="share interrupted")
    for r in results:
        if r.mode == "one-step":
            left.plot([1], [r.samples_per_s / sync], "D", color="C1", label="one-step")
    left.axhline(1.0, color="grey", lw=0.8, ls=":", label="sync")
    left.set(xlabel="max staleness K", ylabel="predicted samples/s over sync",
             title=f"{profile.name} ({profile.kind}), {topology.cells} cell(s)")
    right.set(xlabel="max staleness K", ylabel="versions / fraction", title=f"what it costs ({lengths})")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.text(0.01, 0.01, "predicted by `python -m aioareal simulate` (virtual clock, profile costs)", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
