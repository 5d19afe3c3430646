"""One writer per run directory (docs/reliability.md#run-directories): a second run, or a resume of
a live one, is one line and exit 2 naming the directory and the holder's pid, and touches nothing;
a lock whose holder was SIGKILLed never blocks; a run holds its directory for its whole life."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aioareal.checkpoint.atomic import RUN_LOCK, own_run_dir, release_run_dir
from aioareal.config import load_config, save_config
from aioareal.errors import UserError
from aioareal.run.recipe import resume, train

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
# A live run, as the kernel sees it: a process holding an flock on the directory's lock file, its pid
# written inside (checkpoint/atomic.py). Without importing the package, so it starts in a blink.
HOLD = ("import fcntl, os, sys, time; os.makedirs(sys.argv[1], exist_ok=True); "
        f"fd = os.open(os.path.join(sys.argv[1], {RUN_LOCK!r}), os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); os.write(fd, b'%d\\n' % os.getpid()); "
        "print('held', flush=True); time.sleep(600)")


@pytest.fixture
def holder(tmp_path):
    """Another process that owns tmp_path/run, as a live run does."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run")], stdout=subprocess.PIPE,
                            text=True, env=ENV)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def locked_now(run_dir: Path) -> bool:
    fd = os.open(run_dir / RUN_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: conflicts even in-process
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aioareal", *args], capture_output=True, text=True, env=ENV,
                          timeout=300)


def tiny(run_dir: Path, steps: int = 1):
    return load_config(overrides=["model.name=random:tiny", f"train.steps={steps}", "algo.batch_groups=2",
                                  "eval.every=0"], flags={"run.run_dir": str(run_dir)})


def test_a_second_writer_or_a_resume_of_a_live_run_is_refused_and_touches_nothing(tmp_path, holder):
    run_dir = tmp_path / "run"
    with pytest.raises(UserError) as e:
        train(tiny(run_dir), log=lambda *_: None, printer=lambda row: None)
    assert str(e.value) == (f"{run_dir} is in use by another run or evaluation (pid {holder.pid}); wait for it to end, "
                            "or choose another --run-dir")
    assert sorted(p.name for p in run_dir.iterdir()) == [RUN_LOCK]
    save_config(tiny(run_dir), run_dir / "config.yaml")
    metrics = json.dumps({"step": 0, "reward_mean": 0.5}) + "\n"
    (run_dir / "metrics.jsonl").write_text(metrics)  # no checkpoint yet: a resume would start it over
    with pytest.raises(UserError, match=f"in use by another run or evaluation \\(pid {holder.pid}\\)"):
        resume(run_dir, log=lambda *_: None, printer=lambda row: None)
    assert (run_dir / "metrics.jsonl").read_text() == metrics


@pytest.mark.slow  # two interpreters importing torch: ~10 s on a quiet machine, a minute on a busy one
def test_a_second_run_on_a_live_directory_is_one_line_and_exit_2(tmp_path, holder):
    run_dir = tmp_path / "run"
    done = cli("model.name=random:tiny", "--steps", "1", "--run-dir", str(run_dir))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (f"error: {run_dir} is in use by another run or evaluation (pid {holder.pid}); "
                                   "wait for it to end, or choose another --run-dir")
    assert sorted(p.name for p in run_dir.iterdir()) == [RUN_LOCK]  # nothing written


@pytest.mark.slow
def test_a_resume_of_a_live_run_is_refused_and_touches_nothing(tmp_path, holder):
    run_dir = tmp_path / "run"
    save_config(load_config(overrides=["model.name=random:tiny"], flags={"run.run_dir": str(run_dir)}),
                run_dir / "config.yaml")
    metrics = json.dumps({"step": 0, "reward_mean": 0.5}) + "\n"
    (run_dir / "metrics.jsonl").write_text(metrics)  # no checkpoint yet: a resume would start it over
    done = cli("--resume", str(run_dir))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{run_dir} is in use by another run or evaluation (pid {holder.pid})" in done.stderr
    assert (run_dir / "metrics.jsonl").read_text() == metrics


def test_a_lock_left_by_a_sigkilled_run_never_blocks(tmp_path, holder):
    with pytest.raises(UserError, match=f"in use by another run or evaluation \\(pid {holder.pid}\\)"):
        own_run_dir(tmp_path / "run")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / "run" / RUN_LOCK).exists()  # the file stays; the kernel dropped the lock
    own_run_dir(tmp_path / "run")
    release_run_dir(tmp_path / "run")


def test_a_run_holds_its_directory_while_it_trains_and_frees_it_after(tmp_path):
    run_dir = tmp_path / "run"
    seen: list[bool] = []

    train(tiny(run_dir, steps=2), log=lambda *_: None, printer=lambda row: seen.append(locked_now(run_dir)))
    assert seen and all(seen)
    assert not locked_now(run_dir)
    own_run_dir(run_dir)  # and this process may take it again, as a sweep's next run does
    release_run_dir(run_dir)


def test_the_lock_is_counted_within_a_process(tmp_path):
    run_dir = tmp_path / "run"
    own_run_dir(run_dir)
    own_run_dir(run_dir)  # a resume owns it, then the training it starts takes it again
    release_run_dir(run_dir)
    assert locked_now(run_dir)
    release_run_dir(run_dir)
    assert not locked_now(run_dir)


@pytest.mark.parametrize("plant", ["symlink", "fifo", "folder"])
def test_a_planted_lock_is_refused_in_one_line_and_its_target_kept(tmp_path, plant):
    """A `.lock` planted as a symbolic link is never followed (its target is not truncated), and a
    FIFO or folder in its place is refused without blocking."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    lock = run_dir / RUN_LOCK
    {"symlink": lambda: lock.symlink_to(target), "fifo": lambda: os.mkfifo(lock),
     "folder": lambda: lock.mkdir()}[plant]()
    with pytest.raises(UserError, match="not a regular file") as error:
        own_run_dir(run_dir)
    assert "\n" not in str(error.value) and str(lock) in str(error.value)
    assert target.read_text() == "keep me\n"
    own_run_dir(tmp_path / "elsewhere")  # nothing left held by the refusal
    release_run_dir(tmp_path / "elsewhere")
