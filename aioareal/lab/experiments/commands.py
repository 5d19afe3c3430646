"""`python -m aioareal plot runs/SWEEP` and `python -m aioareal report runs/SWEEP`.

Both take a sweep directory (or one run directory) and write to plots/<its name>/ (a run: RUN_DIR/plots/)
unless --out says otherwise; they print the paths they wrote.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ...errors import UserError, guarded, one_line


def parser(command: str, what: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m aioareal {command}", description=what)
    p.add_argument("path", help="a sweep directory (runs/SWEEP) or a single run directory")
    p.add_argument("--out", help="output directory (default RUN_DIR/plots for a run, plots/<name of PATH> for a sweep)")
    p.add_argument("--threshold", type=float,
                   help="held-out pass rate for time-to-threshold (default: 90%% of the best final mean)")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    return p


def out_dir(args: argparse.Namespace) -> Path:
    """--out, else RUN_DIR/plots for one run (never the repository's own plots/), plots/<name> for a sweep."""
    if args.out:
        return Path(args.out)
    path = Path(args.path)
    return path / "plots" if (path / "config.yaml").is_file() else Path("plots") / path.resolve().name


def threshold(args: argparse.Namespace) -> float | None:
    """--threshold, a held-out pass rate: NaN, infinities and values outside [0, 1] are refused."""
    if args.threshold is not None and not 0 <= args.threshold <= 1:
        raise UserError(f"--threshold must be a held-out pass rate in [0, 1], got {args.threshold!r}")
    return args.threshold


def cmd_plot(argv: list[str]) -> int:
    args = parser("plot", "Plot a sweep: pass rate, time to threshold, staleness, throughput, reward.").parse_args(argv)

    def go() -> int:
        from .plots import plot_sweep

        for path in plot_sweep(args.path, out_dir(args), threshold(args)):
            print(path)
        return 0
    return guarded(args.debug, go)


def cmd_report(argv: list[str]) -> int:
    args = parser("report", "Write report.md: a table per configuration and the figures.").parse_args(argv)

    def go() -> int:
        from .plots import FILES
        from .study_report import write_report

        report = write_report(args.path, out_dir(args), threshold(args))
        for name in FILES:
            print(report.parent / name)
        print(report)
        return 0
    return guarded(args.debug, go)


def cmd_sweep(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m aioareal sweep",
                                description="Run a grid of runs (skips finished ones, resumes unfinished ones).")
    p.add_argument("spec", help="sweep file, e.g. configs/sweeps/staleness-tiny.yaml")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their status, run nothing")
    p.add_argument("--runs-root", default="runs", help="parent of the sweep directory (default runs)")
    p.add_argument("--report", action="store_true", help="write plots and report.md to plots/<name>/ at the end")
    p.add_argument("--no-dashboard", action="store_true", help="one plain line per step instead of the dashboard")
    p.add_argument("--shard", default="0/1",
                   help="I/N: run only every N-th run from run I (0-based), to share a sweep between N processes")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    args = p.parse_args(argv)

    def go() -> int:
        from .sweep import SweepIncomplete, parse_shard, plan, run_sweep, shard_of

        shard = parse_shard(args.shard)
        if args.dry_run:
            name, runs = plan(args.spec, args.runs_root)
            runs = shard_of(runs, shard)
            print(f"sweep {name}: {len(runs)} runs under {Path(args.runs_root) / name}")
            for run in runs:
                status, wrong = run.inspect()
                print(one_line(f"  {run.name:<40} {status}" + (f" ({wrong})" if wrong else "")))
            return 0
        try:
            sweep_dir = run_sweep(args.spec, args.runs_root, dashboard="off" if args.no_dashboard else None,
                                  shard=shard)
        except SweepIncomplete as e:  # the runs that could go on did: their report, then the error
            report(e.sweep_dir)
            raise
        report(sweep_dir)
        return 0

    def report(sweep_dir: Path) -> None:
        if args.report:
            from .study_report import write_report

            print(write_report(sweep_dir, Path("plots") / sweep_dir.name))
    return guarded(args.debug, go)
