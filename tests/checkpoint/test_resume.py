"""Crash safety: SIGKILL a run at random moments, resume it each time, and compare with a run that
was never interrupted. In sync mode on the CPU a resumed run replays exactly, so not only the step
sequence but every logged number must match."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aioareal import checkpoint
from aioareal.checkpoint.resume_plan import resume_config
from aioareal.errors import UserError

STEPS = 8
ARGS = ["--steps", str(STEPS), "run.checkpoint_every=1", "eval.every=4", "algo.batch_groups=8",
        "run.keep_checkpoints=2"]
COMPARED = ("step", "version", "reward_mean", "loss", "grad_norm", "entropy", "staleness_max", "eval_pass_rate",
            "groups_trained")


def launch(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "aioareal", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def comparable(run_dir: Path) -> list[tuple]:
    return [tuple(r.get(k) for k in COMPARED) for r in rows(run_dir)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_path) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    proc = launch(*ARGS, "--run-dir", str(run_dir))
    assert proc.wait(timeout=600) == 0, proc.stderr.read()
    return run_dir


@pytest.mark.slow
def test_sigkill_at_random_points_resumes_without_losing_or_repeating_a_step(tmp_path, reference):
    run_dir = tmp_path / "run"
    rng = random.Random(7)
    kills = 0
    proc = launch(*ARGS, "--run-dir", str(run_dir))
    while kills < 12:
        time.sleep(rng.uniform(0.2, 3.5))  # startup, mid-step, mid-checkpoint: anywhere
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        if (run_dir / "config.yaml").exists():
            proc = launch("--resume", str(run_dir))
        else:  # killed before the run directory existed: start it again
            proc = launch(*ARGS, "--run-dir", str(run_dir))
    assert proc.wait(timeout=600) == 0, proc.stderr.read()
    assert kills >= 10
    assert [r["step"] for r in rows(run_dir)] == list(range(STEPS + 1))
    assert comparable(run_dir) == comparable(reference)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [s for s in range(1, STEPS + 1) for _ in range(8 * 8)]
    assert (run_dir / "DONE").exists()
    assert len(checkpoint.list_checkpoints(run_dir)) == 2  # keep-last-N


@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_and_resumes(tmp_path, reference):
    run_dir = tmp_path / "run"
    proc = launch(*ARGS, "run.checkpoint_every=0", "--run-dir", str(run_dir))
    while not (run_dir / "metrics.jsonl").exists() or len(rows(run_dir)) < 3:
        time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM  # stopped, not finished: scripts must not go on
    assert "continue with: python -m aioareal --resume" in proc.stderr.read()
    stopped_at = len(rows(run_dir)) - 1
    assert stopped_at < STEPS and not (run_dir / "DONE").exists()
    assert checkpoint.load_state(checkpoint.latest_checkpoint(run_dir)).step == stopped_at
    proc = launch("--resume", str(run_dir))
    assert proc.wait(timeout=600) == 0, proc.stderr.read()
    assert comparable(run_dir) == comparable(reference)


def test_resume_refuses_a_changed_config_unless_forced(tmp_path, reference):
    assert resume_config(reference, ["train.steps=20"], {}, force=False).train.steps == 20
    with pytest.raises(UserError, match=r"differs from the run's in algo.lr; pass --force"):
        resume_config(reference, ["algo.lr=0.5"], {}, force=False)
    assert resume_config(reference, ["algo.lr=0.5"], {}, force=True).algo.lr == 0.5
    with pytest.raises(UserError, match="not a run directory"):
        resume_config(tmp_path, [], {}, force=False)


def test_checkpoint_policy_loads_in_plain_transformers(reference):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy = checkpoint.latest_checkpoint(reference) / "policy"
    model = AutoModelForCausalLM.from_pretrained(policy)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    ids = tokenizer("12+34=", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] == ids.shape[1] + 3


def test_a_finished_run_directory_is_not_overwritten(reference):
    proc = launch(*ARGS, "--run-dir", str(reference))
    assert proc.wait(timeout=120) == 2
    assert "already holds a run; continue it with --resume" in proc.stderr.read()
