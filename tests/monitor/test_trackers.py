"""Experiment trackers: the TensorBoard scalars of a run equal its metrics.jsonl, a failing or slow
tracker never stops or blocks the run, a missing package is an error naming it, and W&B and
trackio log offline."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from aioareal.config import load_config
from aioareal.errors import UserError
from aioareal.monitor import trackers
from aioareal.monitor.trackers import TrackerFeed, scalars

RUN = ["model.name=random:tiny", "train.steps=3", "algo.batch_groups=4", "algo.group_size=4", "eval.every=2",
       "data.eval_size=16"]


def _train(run_dir: Path, *overrides: str) -> list[dict]:
    from aioareal.run.recipe import train

    config = load_config(overrides=[*RUN, *overrides], flags={"run.run_dir": str(run_dir)})
    train(config, log=lambda *_: None, printer=lambda row: None)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_scalars_equal_metrics_jsonl(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    rows = _train(tmp_path / "run", "run.trackers=tensorboard")
    acc = event_accumulator.EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    logged = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    expected: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in scalars(row).items():
            expected.setdefault(key, {})[row["step"]] = float(np.float32(value))  # TensorBoard keeps float32
    assert {"reward_mean", "loss", "eval_pass_rate", "time_publish"} <= expected.keys()
    assert logged == expected
    [config] = acc.Tensors("config/text_summary")  # the resolved config, logged once as text
    assert b"trackers: [tensorboard]" in config.tensor_proto.string_val[0]


class _Recorder:
    def __init__(self, fail_at: int | None = None, gate: threading.Event | None = None) -> None:
        self.rows: list[tuple[int, dict]] = []
        self.fail_at, self.gate, self.closed = fail_at, gate, False

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        if step == self.fail_at:
            raise ConnectionError("tracker down")
        self.rows.append((step, metrics))

    def close(self) -> None:
        self.closed = True


def test_a_failing_tracker_is_reported_once_and_dropped_while_the_others_go_on():
    warnings: list[str] = []
    good, bad = _Recorder(), _Recorder(fail_at=1)

    def broken() -> _Recorder:
        raise RuntimeError("cannot start")

    feed = TrackerFeed({"good": lambda: good, "bad": lambda: bad, "broken": broken}, warn=warnings.append)
    for step in range(4):
        feed.log({"step": step, "loss": 0.5 * step, "note": "text", "nan": float("nan"), "flag": True})
    feed.close()
    assert good.rows == [(s, {"loss": 0.5 * s}) for s in range(4)] and good.closed
    assert bad.rows == [(0, {"loss": 0.0})] and not bad.closed
    assert set(feed.failed) == {"bad", "broken"} and len(warnings) == 2
    assert any("bad failed to log (ConnectionError: tracker down)" in w for w in warnings)


def test_a_slow_tracker_never_blocks_log_and_a_full_queue_drops_rows():
    gate = threading.Event()
    slow = _Recorder(gate=gate)
    warnings: list[str] = []
    feed = TrackerFeed({"slow": lambda: slow}, warn=warnings.append, maxsize=2)
    for step in range(10):  # the tracker is stuck on its first row: log must still return at once
        feed.log({"step": step, "loss": 1.0})
    assert feed.dropped >= 10 - 3 and len(warnings) == 1  # one row in the tracker, two queued
    gate.set()
    feed.close()
    assert [s for s, _ in slow.rows] == list(range(10 - feed.dropped))


def test_a_failing_tracker_does_not_stop_the_run(tmp_path, monkeypatch):
    class Failing:
        def __init__(self, run_dir: Path, settings: object, recorded: dict) -> None:
            pass

        def log(self, metrics: dict, step: int) -> None:
            raise OSError("disk full")

        def close(self) -> None:
            pass

    monkeypatch.setitem(trackers.OPENERS, "tensorboard", Failing)
    rows = _train(tmp_path / "run", "run.trackers=tensorboard")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]


def test_a_tracker_without_its_package_is_an_error_naming_it(monkeypatch):
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"'wandb' needs the 'wandb' package.*pip install 'aioareal\[wandb\]'"):
        trackers.check_installed(["wandb"])


OFFLINE = """
import sys
from pathlib import Path
from aioareal.config import load_config, to_dict
from aioareal.monitor.trackers import start_trackers
config = load_config(overrides=["run.trackers=" + sys.argv[1]])
feed = start_trackers(config.run, to_dict(config), Path(sys.argv[2]))
for step in range(3):
    feed.log({"step": step, "loss": 1.0 / (step + 1), "time": 0.1 * step})
feed.close()
assert not feed.failed, feed.failed
"""


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_wandb_and_trackio_log_offline(tmp_path, name):
    pytest.importorskip(name)
    # A fresh process with no network credentials and its stores under tmp_path.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_", "HF_TOKEN"))}
    env.update(TRACKIO_DIR=str(tmp_path / "trackio"), WANDB_SILENT="true", HF_HUB_OFFLINE="1")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.run([sys.executable, "-c", OFFLINE, name, str(run_dir)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    if name == "wandb":
        assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    else:
        assert list((tmp_path / "trackio").glob("*.db"))
