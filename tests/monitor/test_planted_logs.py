"""A run's log files (monitor/metrics.py RunLog) in a directory someone else wrote: a symbolic link,
FIFO or folder planted as metrics.jsonl, samples.jsonl or eval_samples.jsonl is refused in one line
on resume (never read through, blocked on or appended to), and a fresh run removes a planted link
without touching its target."""
from __future__ import annotations

import os

import pytest

from aioareal.errors import UserError
from aioareal.monitor.metrics import EVAL_SAMPLES_FILE, METRICS_FILE, SAMPLES_FILE, RunLog

NAMES = [METRICS_FILE, SAMPLES_FILE, EVAL_SAMPLES_FILE]


def plant(kind: str, path, victim) -> None:
    {"link": lambda: path.symlink_to(victim), "dangling link": lambda: path.symlink_to(victim.parent / "new"),
     "fifo": lambda: os.mkfifo(path), "folder": path.mkdir}[kind]()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["link", "dangling link", "fifo", "folder"])
def test_a_planted_log_file_is_refused_on_resume(tmp_path, name, kind):
    run_dir, victim = tmp_path / "run", tmp_path / "victim.jsonl"
    run_dir.mkdir()
    victim.write_text('{"step": 0}\n{"step": 5}\n')
    plant(kind, run_dir / name, victim)
    with pytest.raises(UserError, match="not a regular file") as error:
        RunLog(run_dir, resume_step=1)
    assert "\n" not in str(error.value) and name in str(error.value)
    assert victim.read_text() == '{"step": 0}\n{"step": 5}\n' and not (tmp_path / "new").exists()


@pytest.mark.parametrize("name", NAMES)
def test_a_fresh_run_removes_a_planted_link_and_writes_its_own_file(tmp_path, name):
    run_dir, victim = tmp_path / "run", tmp_path / "victim.jsonl"
    run_dir.mkdir()
    victim.write_text("precious\n")
    plant("link", run_dir / name, victim)
    log = RunLog(run_dir)
    log.step({"step": 0, "reward_mean": 0.5})
    log.close()
    assert victim.read_text() == "precious\n"
    assert not (run_dir / name).is_symlink() and (run_dir / name).is_file()
