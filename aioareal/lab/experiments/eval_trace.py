"""The report's seed-by-seed table of held-out evaluations: each run's pass rate at every evaluation
step, with the share of its greedy answers cut off at generation.max_new_tokens.

Means over seeds hide what a study on a real model most needs to see: how far seeds of one
configuration lie apart, and phases where a policy writes past the length cap (a preamble before
the answer) and scores near zero until it learns to answer shorter. The cut-off share comes from
eval_samples.jsonl (`truncated`, greedy rows only); runs without that file show the pass rate alone.
"""
from __future__ import annotations

import math
from collections import defaultdict

import pandas as pd

from ...errors import reading
from ...io import iter_jsonl
from .distributions import markdown_grid
from .load import Run

CUT_SHOWN = 0.05  # below this share of cut-off answers a cell shows the pass rate alone


def cut_off_shares(run: Run) -> dict[int, float]:
    """Evaluation step -> fraction of that evaluation's greedy answers that hit the length cap."""
    file = run.dir / "eval_samples.jsonl"
    if not file.is_file():
        return {}
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # step -> [cut, all]
    with reading(file, "a run's held-out completions"):
        for row in iter_jsonl(file, skip_bad=True):
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(step, int) or isinstance(step, bool) or row.get("greedy") is False:
                continue  # a sampled answer (pass@k) says nothing of what the greedy policy writes
            counts[step][0] += bool(row.get("truncated"))
            counts[step][1] += 1
    return {step: cut / n for step, (cut, n) in counts.items()}


def eval_trace_table(groups: dict[str, list[Run]]) -> pd.DataFrame:
    """One row per run: configuration, seed, then one column per evaluation step (any run's)."""
    traces = []
    for label, runs in groups.items():
        for run in sorted(runs, key=lambda r: str(r.setting("run.seed", ""))):
            evals = run.evals()
            rates = dict(zip(evals["step"].astype(int), evals["eval_pass_rate"]))
            traces.append((label, run.setting("run.seed", "–"), rates, cut_off_shares(run)))
    steps = sorted({step for *_, rates, _ in traces for step in rates})
    rows = [{"configuration": label, "seed": seed,
             **{str(step): _cell(rates.get(step), cuts.get(step)) for step in steps}}
            for label, seed, rates, cuts in traces]
    return pd.DataFrame(rows, columns=["configuration", "seed", *map(str, steps)])


def _cell(rate: float | None, cut: float | None) -> str:
    if rate is None or math.isnan(rate):
        return "–"
    return f"{rate:.2f}" if cut is None or cut < CUT_SHOWN else f"{rate:.2f} ({cut:.0%} cut)"


def eval_trace_section(groups: dict[str, list[Run]]) -> list[str]:
    """The report's lines for the table (none when no run has an evaluation)."""
    table = eval_trace_table(groups)
    if len(table.columns) == 2:
        return []
    header = ["configuration", "seed", *[f"step {c}" for c in table.columns[2:]]]
    return ["", "## Held-out pass rate by evaluation, seed by seed", "", markdown_grid(table, header), "",
            "Each run's held-out pass rate at each evaluation; \"(N% cut)\": that share of its greedy answers "
            f"hit generation.max_new_tokens (shown from {CUT_SHOWN:.0%}; from eval_samples.jsonl)."]
