"""Named phase timings: the timer itself, the time_<phase> columns of a real run, and the
dashboard's line of them."""
from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from aioareal import timing
from aioareal.config import load_config
from aioareal.monitor.dashboard import render
from aioareal.monitor.metrics import LiveState
from aioareal.run.recipe import train
from aioareal.timing import PhaseTimer

TRAIN_PHASES = ["advantages", "pack", "fixed_logprobs", "loss", "optimizer", "publish"]


def test_phase_timer_accumulates_by_name_and_take_starts_afresh(monkeypatch):
    clock = iter([0.0, 0.25, 1.0, 1.5, 2.0, 2.0])  # a: 0.25 + 0.5 s, b: 0 s
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    timer = PhaseTimer("cpu")
    for _ in range(2):
        with timer("a"):
            pass
    with timer("b"):
        pass
    assert timer.take() == {"a": 0.75, "b": 0.0}
    assert timer.take() == {}


def test_a_disabled_timer_records_nothing():
    timer = PhaseTimer("cpu", enabled=False)
    with timer("a"):
        pass
    assert timer.take() == {}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("timing") / "run"
    config = load_config(overrides=["model.name=random:tiny", "train.steps=3", "algo.batch_groups=4",
                                    "eval.every=0", "data.eval_size=8", "algo.objective=decoupled"],
                         flags={"run.run_dir": str(run_dir), "rollout.mode": "async"})
    train(config, log=lambda *_: None, printer=lambda row: None)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_every_step_row_has_the_train_phases_and_they_add_up_to_the_step(rows):
    for row in rows[1:]:
        assert {k[5:] for k in row if k.startswith("time_") and not k.startswith("time_gen_")} == set(TRAIN_PHASES)
        phases = [row[f"time_{p}"] for p in TRAIN_PHASES]
        step_seconds = row["train_tokens"] / row["train_tokens_per_s"]  # the trainer call's duration
        # The phases lie within the trainer call (it adds the thread hand-off and the metrics
        # read-back): containment, not speed, so it holds on any machine under any load.
        assert all(p >= 0 for p in phases) and sum(phases) <= step_seconds + 1e-3
    assert rows[0].get("time_loss") is None  # the step-0 evaluation trains nothing


def test_generator_phases_add_up_to_its_busy_time(rows):
    for row in rows[1:]:
        assert {"time_gen_admit", "time_gen_prefill", "time_gen_decode", "time_gen_sync",
                "time_gen_bookkeep", "time_gen_score"} <= set(row)
    # Async K=2 may generate everything in the first interval: compare over the whole run.
    phases = sum(v for r in rows[1:] for k, v in r.items() if k.startswith("time_gen_") and k != "time_gen_score")
    walls = [b["time"] - a["time"] for a, b in zip(rows, rows[1:])]
    busy = sum((1 - r["gen_idle_frac"]) * wall for r, wall in zip(rows[1:], walls))
    assert 0 < phases <= busy * 1.05 + 0.01  # the phases lie within the generator's busy time
    assert sum(r["time_gen_score"] for r in rows[1:]) > 0


def test_the_dashboard_shows_the_longest_phases_of_the_last_step():
    live = LiveState("r", "async", 2, "ppo", [], 10)
    live.record({"step": 1, "reward_mean": 0.5, "time_loss": 0.41, "time_pack": 0.01, "time_optimizer": 0.02,
                 "time_gen_decode": 0.9, "time_gen_admit": 0.001})
    snap = live.refresh({"trainer_version": 1, "generator_version": 1, "groups_running": 2, "groups_ready": 0})
    assert snap.train_phases == {"loss": 0.41, "pack": 0.01, "optimizer": 0.02}
    assert snap.gen_phases == {"decode": 0.9, "admit": 0.001}
    assert live.latest is snap and snap.groups_running == 2
    console = Console(record=True, width=100, height=30, force_terminal=True, color_system=None, file=io.StringIO())
    console.print(render(snap))
    text = console.export_text()
    line = next(line for line in text.splitlines() if "step s" in line)
    assert line.index("loss 0.41s") < line.index("optimizer 0.02s") < line.index("pack 0.01s")
    assert "decode 0.90s" in text
