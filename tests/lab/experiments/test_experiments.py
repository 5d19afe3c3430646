"""plot / report on synthetic sweeps whose numbers are worked out by hand below.

The sweep: two configurations (sync K=0, async K=2) x two seeds, 4 steps of 2 groups x 4 samples
(8 trained samples per step), evaluations at steps 0, 2 and 4.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from aioareal.cli import main
from aioareal.errors import UserError
from aioareal.lab.experiments.load import choose_threshold, configuration_labels, load_runs
from aioareal.lab.experiments.plots import FILES, plot_sweep
from aioareal.lab.experiments.study_report import summarise, write_report

# run name -> (mode, K, seed, time per step 0..4, eval pass rate at steps 0/2/4, staleness per step 1..4,
#              (groups_admitted, groups_dropped_stale, groups_in_flight) at the last step)
RUNS = {
    "sync-s0": ("sync", 0, 0, [0.1, 1.0, 2.0, 3.0, 4.0], [0.2, 0.5, 0.7], [0, 0, 0, 0], (8, 0, 0)),
    "sync-s1": ("sync", 0, 1, [0.1, 1.2, 2.5, 3.7, 5.0], [0.2, 0.6, 0.55], [0, 0, 0, 0], (8, 0, 0)),
    "async-s0": ("async", 2, 0, [0.1, 0.5, 1.0, 1.5, 2.0], [0.2, 0.3, 0.8], [0, 1, 2, 2], (10, 1, 1)),
    "async-s1": ("async", 2, 1, [0.1, 0.8, 1.5, 2.2, 3.0], [0.2, 0.4, 0.6], [0, 0, 1, 2], (12, 0, 4)),
}
SYNC, ASYNC = "mode=sync K=0", "mode=async K=2"


def config(name: str, mode: str, k: int, seed: int) -> dict:
    return {"model": {"name": "tiny"}, "data": {"task": "arithmetic"},
            "algo": {"objective": "ppo", "group_size": 4, "batch_groups": 2, "lr": 2e-4},
            "rollout": {"mode": mode, "max_staleness": k}, "train": {"steps": 4}, "eval": {"every": 2},
            "warmup": {"max_steps": 3000 + seed}, "run": {"seed": seed, "run_dir": f"runs/sweep/{name}"}}


def write_run(d: Path, name: str, spec: tuple) -> None:
    mode, k, seed, times, passes, stale, (admitted, dropped, in_flight) = spec
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(config(name, mode, k, seed)))
    rows = [{"step": 0, "version": 0, "time": times[0], "eval_pass_rate": passes[0], "eval_len_mean": 3.0}]
    for step in range(1, 5):
        last = step == 4
        rows.append({"step": step, "version": step, "time": times[step], "reward_mean": 0.1 * step, "loss": 0.0,
                     "kl": None, "grad_norm": 1.0, "clip_frac": 0.0, "staleness_mean": float(stale[step - 1]),
                     "staleness_max": stale[step - 1], "dropped_stale": 0, "gen_tokens_per_s": 1000.0 * step,
                     "train_tokens_per_s": 2000.0, "samples_per_s": 50.0, "gen_idle_frac": 0.5,
                     "train_idle_frac": 0.25, "groups_admitted": admitted if last else 2 * step,
                     "groups_trained": 2 * step, "groups_dropped_stale": dropped if last else 0, "groups_rejected": 0,
                     "groups_in_flight": in_flight if last else 0, "reward_failures": 0})
        if step % 2 == 0:
            rows[-1]["eval_pass_rate"] = passes[step // 2]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = [{"step": s, "group_id": 2 * s + g, "version_min": s - 1 - stale[s - 1], "version_max": s - 1,
                "staleness": stale[s - 1], "reward": 1.0, "advantage": 0.0, "length": 4, "finish_reason": "stop",
                "admitted_at": 0.0, "finished_at": 0.0, "trained_at": times[s]}
               for s in range(1, 5) for g in range(2) for _ in range(4)]
    (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "runs" / "sweep"
    for name, spec in RUNS.items():
        write_run(root / name, name, spec)
    (root / "sweep.yaml").write_text("grid: {}\n")
    (root / "sync-s0" / "DONE").touch()
    with (root / "async-s1" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "time": 9')  # torn by a crash mid-write
    return root


def by_label(table):
    return table.set_index("configuration")


def test_labels_group_seeds(sweep):
    runs = load_runs(sweep)
    assert sorted(r.name for r in runs) == sorted(RUNS)
    labels = configuration_labels(runs)
    assert labels == {"sync-s0": SYNC, "sync-s1": SYNC, "async-s0": ASYNC, "async-s1": ASYNC}
    assert [r.finished for r in sorted(runs, key=lambda r: r.name)] == [False, False, True, False]


def test_report_numbers_match_the_files(sweep):
    t = by_label(summarise(load_runs(sweep), 0.55))
    assert list(t.index) == [SYNC, ASYNC]  # sync before async
    assert list(t["n_seeds"]) == [2, 2]
    assert t.loc[SYNC, "final_pass_rate"] == pytest.approx((0.7 + 0.55) / 2)
    assert t.loc[SYNC, "best_pass_rate"] == pytest.approx((0.7 + 0.6) / 2)
    assert t.loc[SYNC, "final_range"] == "0.550-0.700" and t.loc[ASYNC, "final_range"] == "0.600-0.800"
    assert t.loc[ASYNC, "final_pass_rate"] == pytest.approx((0.8 + 0.6) / 2)
    # sync: seed 0 first >= 0.55 at step 4 (t=4.0), seed 1 at step 2 (t=2.5); async: both at step 4
    assert t.loc[SYNC, "time_to_threshold_s"] == pytest.approx((4.0 + 2.5) / 2)
    assert t.loc[SYNC, "samples_to_threshold"] == pytest.approx((4 * 8 + 2 * 8) / 2)
    assert t.loc[ASYNC, "time_to_threshold_s"] == pytest.approx((2.0 + 3.0) / 2)
    assert t.loc[ASYNC, "samples_to_threshold"] == pytest.approx(32)
    assert list(t["n_reached"]) == [2, 2]
    assert t.loc[SYNC, "samples_per_s"] == pytest.approx((32 / 4.0 + 32 / 5.0) / 2)
    assert t.loc[ASYNC, "samples_per_s"] == pytest.approx((32 / 2.0 + 32 / 3.0) / 2)
    assert t.loc[SYNC, "mean_staleness"] == 0
    assert t.loc[ASYNC, "mean_staleness"] == pytest.approx((5 / 4 + 3 / 4) / 2)
    assert t.loc[SYNC, "dropped_frac"] == 0
    assert t.loc[ASYNC, "dropped_frac"] == pytest.approx((1 / 10 + 0 / 12) / 2)


def test_threshold_reached_by_some_seeds_only(sweep):
    t = by_label(summarise(load_runs(sweep), 0.65))
    # only sync seed 0 (0.7 at t=4) and async seed 0 (0.8 at t=2) reach 0.65; the mean is over those
    assert list(t["n_reached"]) == [1, 1]
    assert t.loc[SYNC, "time_to_threshold_s"] == pytest.approx(4.0)
    assert t.loc[ASYNC, "samples_to_threshold"] == pytest.approx(32)
    never = by_label(summarise(load_runs(sweep), 0.95))
    assert never["time_to_threshold_s"].isna().all() and list(never["n_reached"]) == [0, 0]


def test_derived_threshold(sweep):
    value, how = choose_threshold(load_runs(sweep))
    assert value == pytest.approx(0.9 * 0.7)  # best final mean: async (0.8 + 0.6) / 2
    assert "90%" in how and ASYNC in how
    assert choose_threshold(load_runs(sweep), 0.5) == (0.5, "given on the command line")


def test_staleness_falls_back_to_metrics_without_samples(sweep):
    (sweep / "async-s0" / "samples.jsonl").unlink()
    t = by_label(summarise(load_runs(sweep), 0.55))
    assert t.loc[ASYNC, "mean_staleness"] == pytest.approx((5 / 4 + 3 / 4) / 2)


def test_plots_written(sweep, tmp_path):
    paths = plot_sweep(sweep, tmp_path / "plots", threshold=0.6)
    assert [p.name for p in paths] == list(FILES)
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000


def test_single_run_dir(sweep, tmp_path):
    runs = load_runs(sweep / "async-s0")
    assert [r.name for r in runs] == ["async-s0"]
    assert configuration_labels(runs) == {"async-s0": "mode=async K=2 objective=ppo"}
    t = summarise(runs, None)  # derived: 90% of 0.8
    assert t["n_seeds"].tolist() == [1] and t["time_to_threshold_s"].tolist() == [pytest.approx(2.0)]
    report = write_report(sweep / "async-s0", tmp_path / "one")
    assert "mode=async K=2 objective=ppo" in report.read_text()
    assert all((tmp_path / "one" / f).stat().st_size > 0 for f in FILES)


def test_no_runs_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        load_runs(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no runs"):
        load_runs(tmp_path / "empty")
    (tmp_path / "blank" / "r").mkdir(parents=True)
    (tmp_path / "blank" / "r" / "config.yaml").write_text("run: {seed: 0}\n")
    with pytest.raises(UserError, match="metrics.jsonl"):
        load_runs(tmp_path / "blank")


def test_diagnostics_average_steps_then_seeds_and_skip_absent_metrics(sweep):
    from aioareal.lab.experiments.load import by_configuration
    from aioareal.lab.experiments.study_report import diagnostics

    groups = by_configuration(load_runs(sweep))
    # capped_frac logged by the async runs only (as decoupled logs it and ppo does not); step 0 has none.
    for run, per_step in zip(groups[ASYNC], ([0.0, 0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 0.0, 0.2, 0.2])):
        run.metrics["capped_frac"] = per_step[:len(run.metrics)]
    t = by_label(diagnostics(groups))
    assert t.loc[ASYNC, "capped_frac"] == pytest.approx((0.25 + 0.1) / 2)
    assert math.isnan(t.loc[SYNC, "capped_frac"]) and (t["clip_frac"] == 0).all()
    assert "behav_weight_mean" not in t  # no run logged it: no empty column


def test_cli_report(sweep, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "findings.md").write_text("Hand-written: why the curves look as they do.\n")
    assert main(["report", str(sweep), "--out", str(out), "--threshold", "0.55"]) == 0
    text = (out / "report.md").read_text()
    assert "held-out pass rate 0.550 (given on the command line)" in text
    assert (f"| {SYNC} | 2 | 0.625 | 0.550-0.700 | 0.650 | 3.2" in text
            or f"| {SYNC} | 2 | 0.625 | 0.550-0.700 | 0.650 | 3.3" in text)
    assert all(f"]({name})" in text for name in FILES)
    assert text.index("Hand-written: why") < text.index("**Threshold**")  # findings kept on top
    assert str(out / "report.md") in capsys.readouterr().out


def test_cli_plot_default_out_and_errors(sweep, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["plot", str(sweep)]) == 0
    assert all((tmp_path / "plots" / "sweep" / f).is_file() for f in FILES)
    assert main(["report", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


def test_staleness_distribution_and_idle_tables(sweep):
    from aioareal.lab.experiments.distributions import distribution_sections, idle_table, staleness_table
    from aioareal.lab.experiments.load import by_configuration

    groups = by_configuration(load_runs(sweep))
    stale = staleness_table(groups).set_index("configuration")
    # async: seed 0 trains 8 samples a step at staleness 0, 1, 2, 2; seed 1 at 0, 0, 1, 2 (64 pooled)
    assert stale.loc[ASYNC, "samples"] == 64 and stale.loc[ASYNC, "max"] == 2
    assert [stale.loc[ASYNC, str(k)] for k in range(4)] == pytest.approx([3 / 8, 2 / 8, 3 / 8, 0])
    assert stale.loc[ASYNC, "mean"] == "1.00 (0.75-1.25)" and stale.loc[SYNC, "mean"] == "0.00 (0.00-0.00)"
    assert stale.loc[SYNC, "0"] == 1.0
    idle = idle_table(groups).set_index("configuration")
    assert idle.loc[SYNC, "gen_idle_frac"] == "50% (50%-50%)" and idle.loc[ASYNC, "train_idle_frac"] == "25% (25%-25%)"
    assert idle.loc[SYNC, "samples_per_s"] == "7.20 (6.40-8.00)"  # 32 samples in 4.0 s and in 5.0 s
    text = "\n".join(distribution_sections(groups))
    assert "## Staleness distribution" in text and "| mode=async K=2 | 64 | 1.00 (0.75-1.25) | 2 | 37.5% |" in text
    for run in groups[ASYNC] + groups[SYNC]:  # without samples.jsonl only the idle table is left
        (run.dir / "samples.jsonl").unlink()
    text = "\n".join(distribution_sections(by_configuration(load_runs(sweep))))
    assert "Staleness distribution" not in text and "## Idle time and throughput" in text


def test_plot_of_one_run_writes_under_it_and_speaks_of_one_run(sweep, tmp_path, monkeypatch):
    from aioareal.lab.experiments import plots
    from aioareal.lab.experiments.load import by_configuration

    monkeypatch.chdir(tmp_path)
    run = sweep / "async-s0"
    assert main(["plot", str(run)]) == 0
    assert all((run / "plots" / f).is_file() for f in FILES) and not (tmp_path / "plots").exists()
    one = plots.draw_figures(by_configuration(load_runs(run)), 0.5, "given")
    for fig in one:
        plots.one_seed_titles(fig)
    titles = [ax.get_title() for fig in one for ax in fig.axes] + [fig.get_suptitle() for fig in one]
    assert titles and not any("seeds" in t or "min-max" in t for t in titles), titles
    assert "Held-out pass rate" in titles
