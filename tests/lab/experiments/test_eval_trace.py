"""The report's seed-by-seed evaluation table (experiments/eval_trace.py), and runs recorded before a
config key existed grouped with runs at that key's default (experiments/load.py `with_defaults`)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from aioareal.lab.experiments.eval_trace import cut_off_shares, eval_trace_table
from aioareal.lab.experiments.load import by_configuration, load_runs
from aioareal.lab.experiments.study_report import write_report

LABEL = "mode=async K=4 objective=ppo"  # one configuration: its mode, K and objective


def write_run(d: Path, seed: int, passes: list[float], train: dict | None = None,
              evals: list[dict] | None = None) -> None:
    d.mkdir(parents=True)
    config = {"rollout": {"mode": "async", "max_staleness": 4}, "algo": {"objective": "ppo"},
              "train": {"steps": 4, **(train or {})}, "run": {"seed": seed}}
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"step": s, "time": float(s), "eval_pass_rate": p} for s, p in zip((0, 2, 4), passes)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if evals is not None:
        (d / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals) + '{"step": 4, "tru')


def answers(step: int, cut: int, n: int = 4) -> list[dict]:
    return [{"step": step, "greedy": True, "truncated": i < cut, "text": "x"} for i in range(n)]


def test_each_seed_gets_a_row_with_the_share_of_answers_cut_at_the_length_cap(tmp_path):
    root = tmp_path / "sweep"
    sampled = [{"step": 2, "greedy": False, "truncated": True} for _ in range(8)]  # pass@k draws: not counted
    write_run(root / "s1", 1, [0.1, 0.5, 0.6], evals=answers(0, 0) + answers(2, 0) + sampled + answers(4, 0))
    write_run(root / "s0", 0, [0.1, 0.02, 0.4], evals=answers(0, 0) + answers(2, 3) + answers(4, 1, n=40))
    runs = load_runs(root)
    assert cut_off_shares(next(r for r in runs if r.name == "s0")) == {0: 0.0, 2: 0.75, 4: 0.025}
    table = eval_trace_table(by_configuration(runs))
    assert list(table.columns) == ["configuration", "seed", "0", "2", "4"]
    assert table.values.tolist() == [[LABEL, 0, "0.10", "0.02 (75% cut)", "0.40"],  # 2.5% is under the 5% shown
                                     [LABEL, 1, "0.10", "0.50", "0.60"]]
    report = write_report(root, tmp_path / "out").read_text()
    assert "## Held-out pass rate by evaluation, seed by seed" in report
    assert f"| {LABEL} | 0 | 0.10 | 0.02 (75% cut) | 0.40 |" in report


def test_runs_without_held_out_completions_show_the_pass_rate_alone(tmp_path):
    write_run(tmp_path / "r", 0, [0.1, 0.3])  # evaluated at steps 0 and 2 only
    write_run(tmp_path / "q", 1, [0.1, 0.2, 0.3])
    table = eval_trace_table(by_configuration(load_runs(tmp_path)))
    assert table.values.tolist() == [[LABEL, 0, "0.10", "0.30", "–"], [LABEL, 1, "0.10", "0.20", "0.30"]]


def test_a_key_added_after_a_run_was_recorded_reads_as_its_default(tmp_path):
    write_run(tmp_path / "old", 0, [0.1, 0.2, 0.3])  # recorded before train.optimizer_moments existed
    write_run(tmp_path / "new", 1, [0.1, 0.2, 0.3], train={"optimizer_moments": "float32"})
    write_run(tmp_path / "half", 0, [0.1, 0.2, 0.3], train={"optimizer_moments": "bfloat16"})
    groups = by_configuration(load_runs(tmp_path))
    assert {label: sorted(r.name for r in runs) for label, runs in groups.items()} == {
        "optimizer_moments=float32": ["new", "old"], "optimizer_moments=bfloat16": ["half"]}
