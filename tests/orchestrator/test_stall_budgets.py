"""run.stall_timeout_s (orchestrator/workers.py): a generator step, a training step or a checkpoint
write that runs past the budget stops the run with a one-line cause naming it, instead of waiting
forever; what the run wrote before stays readable and resumable. Each hang is injected."""
from __future__ import annotations

import json
import time

import pytest

from aioareal import checkpoint
from aioareal.config import load_config
from aioareal.orchestrator import workers
from aioareal.orchestrator.workers import Stalled
from aioareal.run.recipe import train

KEYS = ["train.steps=4", "algo.batch_groups=2", "algo.group_size=2", "run.dashboard=off", "eval.every=0",
        "run.checkpoint_every=1", "run.stall_timeout_s=0.5"]


def hangs_once_at(call: int, real):
    """`real`, but the `call`-th call sleeps 2 s first (a hang the budget sees; short, so the test's
    threads end)."""
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            time.sleep(2.0)
        return real(*args, **kwargs)
    return wrapped


@pytest.mark.parametrize(("where", "what"), [
    ("generator", "a generator step"),
    ("trainer", "a training step"),
    ("checkpoint", "a checkpoint write"),
])
def test_a_call_past_the_budget_stops_the_run_naming_it(where, what, tmp_path, tiny_model_path, monkeypatch):
    if where == "generator":
        monkeypatch.setattr(workers.EngineWorker, "_step", hangs_once_at(3, workers.EngineWorker._step))
    elif where == "trainer":
        monkeypatch.setattr(workers.TrainerWorker, "_train", hangs_once_at(2, workers.TrainerWorker._train))
    else:
        monkeypatch.setattr(checkpoint, "save", hangs_once_at(2, checkpoint.save))
    run = tmp_path / "run"
    config = load_config(None, [*KEYS, f"run.run_dir={run}"])
    started = time.monotonic()
    with pytest.raises(Stalled, match=f"{what} .*has not returned after 0.5 s \\(run.stall_timeout_s\\)"):
        train(config, log=lambda *_: None, printer=lambda row: None)
    assert time.monotonic() - started < 60
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(len(rows)))  # every row whole, each step once
    assert len(rows) < 5  # it stopped: four steps would write five rows


def test_no_budget_waits(tmp_path, tiny_model_path, monkeypatch):
    monkeypatch.setattr(workers.TrainerWorker, "_train", hangs_once_at(1, workers.TrainerWorker._train))
    config = load_config(None, [*KEYS, "train.steps=1", "run.stall_timeout_s=0", f"run.run_dir={tmp_path / 'run'}"])
    train(config, log=lambda *_: None, printer=lambda row: None)  # 2 s is a wait, not a hang, without a budget
