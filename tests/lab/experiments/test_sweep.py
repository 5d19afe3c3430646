"""Sweeps: grid expansion, and an interrupted sweep that finishes with exactly the runs and steps
it would have had without the interruption."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal.errors import UserError
from aioareal.lab.experiments.sweep import parse_shard, plan, shard_of

SPEC = """
name: mini
base: {base}
set: {{train.steps: 4, algo.batch_groups: 4, eval.every: 2, run.checkpoint_every: 1, run.dashboard: "off"}}
cases:
  - {{rollout.mode: sync}}
  - {{rollout.mode: async, rollout.max_staleness: 2}}
seeds: [0, 1]
"""


def write_spec(tmp_path: Path, text: str = SPEC) -> Path:
    path = tmp_path / "mini.yaml"
    base = Path(__file__).resolve().parents[3] / "configs" / "tiny-arith.yaml"
    path.write_text(text.format(base=base))
    return path


def test_plan_expands_cases_grid_and_seeds(tmp_path):
    spec = write_spec(tmp_path, SPEC.replace("seeds: [0, 1]", "grid: {{algo.objective: [ppo, dg]}}\nseeds: [0, 1]"))
    name, runs = plan(spec, tmp_path / "runs")
    assert name == "mini" and len(runs) == 8
    assert runs[0].name == "mode=sync_obj=ppo_seed=0"
    assert {r.config.rollout.max_staleness for r in runs if r.config.rollout.mode == "async"} == {2}
    assert all(r.config.train.steps == 4 and r.status == "new" for r in runs)
    assert runs[-1].run_dir == tmp_path / "runs" / "mini" / "mode=async_K=2_obj=dg_seed=1"


def test_invalid_points_fail_before_anything_runs(tmp_path):
    with pytest.raises(UserError, match="run 'mode=sync_K=3_seed=0': config key 'rollout.max_staleness'"):
        plan(write_spec(tmp_path, SPEC.replace("{{rollout.mode: sync}}",
                                               "{{rollout.mode: sync, rollout.max_staleness: 3}}")))
    with pytest.raises(UserError, match="unknown sweep key"):
        plan(write_spec(tmp_path, SPEC + "\ngrids: {{}}\n"))


def test_a_grid_too_large_to_expand_is_one_line_before_anything_is_expanded(tmp_path):
    grid = ", ".join(f"algo.{k}: [{', '.join(str(v / 100) for v in range(1, 11))}]"
                     for k in ("lr", "clip_eps_low", "clip_eps_high", "grad_clip", "behav_cap", "dg_eta",
                               "weight_decay", "adam_beta2", "warmup_steps"))
    with pytest.raises(UserError, match=r"4000000000 runs \(cases x grid x seeds\), more than a sweep holds"):
        plan(write_spec(tmp_path, SPEC.replace("seeds: [0, 1]", "grid: {{" + grid + "}}\nseeds: [0, 1]")))


@given(st.integers(1, 12), st.integers(0, 30))
@settings(max_examples=50, deadline=None)
def test_shards_split_the_plan_into_disjoint_parts_that_cover_it(count, n_runs):
    runs = list(range(n_runs))
    parts = [shard_of(runs, parse_shard(f"{i}/{count}")) for i in range(count)]
    assert sorted(r for part in parts for r in part) == runs
    assert all(len(part) in (n_runs // count, -(-n_runs // count)) for part in parts)  # balanced


def test_shard_dry_run_lists_its_runs_and_bad_shards_fail_in_one_line(tmp_path, capsys):
    from aioareal.cli import main

    spec = write_spec(tmp_path)
    assert main(["sweep", str(spec), "--dry-run", "--shard", "1/2", "--runs-root", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "2 runs" in out and "mode=sync_seed=1" in out and "mode=async_K=2_seed=1" in out and "seed=0" not in out
    for bad in ("2/2", "1", "a/b", "-1/2", "0/0"):
        assert main(["sweep", str(spec), "--dry-run", f"--shard={bad}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --shard") and "\n" not in err


def sweep(spec: Path, root: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "aioareal", "sweep", str(spec), "--runs-root", str(root),
                             "--no-dashboard"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_interrupted_sweep_finishes_with_exactly_its_runs_and_steps(tmp_path, tiny_model_path):
    spec, root = write_spec(tmp_path), tmp_path / "runs"
    proc = sweep(spec, root)
    first = root / "mini" / "mode=sync_seed=1" / "metrics.jsonl"
    while not first.exists() or len(first.read_text().splitlines()) < 3:  # kill inside the second run
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    out, err = sweep(spec, root).communicate(timeout=600)
    assert "run 1/4 mode=sync_seed=0 (done)" in out, err
    assert "run 2/4 mode=sync_seed=1 (resume from step" in out
    for run in ("mode=sync_seed=0", "mode=sync_seed=1", "mode=async_K=2_seed=0", "mode=async_K=2_seed=1"):
        rows = [json.loads(line) for line in (root / "mini" / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1, 2, 3, 4], run
        assert (root / "mini" / run / "DONE").exists()
    assert sorted(p.name for p in (root / "mini").iterdir()) == sorted(
        ["mode=sync_seed=0", "mode=sync_seed=1", "mode=async_K=2_seed=0", "mode=async_K=2_seed=1"])
    out, _ = sweep(spec, root).communicate(timeout=120)  # a third time: nothing left to do
    assert out.count("(done)") == 4


def test_a_stopped_run_stops_the_sweep_with_the_signal_exit_code(tmp_path, tiny_model_path):
    """SIGTERM during a run: the run checkpoints and the sweep ends with it (exit 143), instead of
    starting the next run as if the stopped one had finished."""
    from aioareal.errors import RunStopped
    from aioareal.lab.experiments.sweep import run_sweep

    def log(line):
        if line.startswith("step") and line.split("/")[0].split() == ["step", "1"]:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the run's event loop: finish the step, stop

    root = tmp_path / "runs"
    with pytest.raises(RunStopped) as info:
        run_sweep(write_spec(tmp_path), root, log=log)
    assert info.value.exit_code == 128 + signal.SIGTERM and "--resume" in str(info.value)
    assert [p.name for p in (root / "mini").iterdir()] == ["mode=sync_seed=0"]  # the next run never started
    assert not (root / "mini" / "mode=sync_seed=0" / "DONE").exists()


def test_resume_of_a_finished_run_that_lost_its_done_file_marks_it_done(tmp_path):
    from aioareal.config import load_config
    from aioareal.run.recipe import resume, train

    config = load_config(overrides=["model.name=random:tiny", "train.steps=2", "algo.batch_groups=2",
                                    "eval.every=0", "data.eval_size=8"], flags={"run.run_dir": str(tmp_path / "r")})
    run_dir = train(config, log=lambda *_: None, printer=lambda row: None)
    (run_dir / "DONE").unlink()  # killed after the last checkpoint, before DONE was written
    resume(run_dir, log=lambda *_: None, printer=lambda row: None)
    assert (run_dir / "DONE").exists()


def test_a_run_name_too_long_for_the_file_system_fails_when_planned(tmp_path):
    long_prompt = "q" * 300  # a grid value that goes into the run's directory name
    spec = SPEC.replace("seeds: [0, 1]", "grid: {{data.system_prompt: [short, " + long_prompt + "]}}\nseeds: [0]")
    with pytest.raises(UserError, match=r"run directory name '.*' is \d+ bytes, past the file system's 255"):
        plan(write_spec(tmp_path, spec), tmp_path / "runs")
    with pytest.raises(UserError, match="past the file system's 255"):  # the sweep's own name too
        plan(write_spec(tmp_path, SPEC.replace("name: mini", "name: " + "n" * 256)), tmp_path / "runs")


def _checkpoint(run_dir: Path, step: int, state: str) -> Path:
    path = run_dir / "checkpoints" / f"step-{step:06d}"
    path.mkdir(parents=True)
    (path / "state.json").write_text(state)
    return path / "state.json"


def test_an_unreadable_state_json_is_one_line_and_the_other_runs_go_on(tmp_path, monkeypatch, capsys):
    """A run whose only checkpoint's state.json is cut is skipped and named (file and what is wrong);
    one whose newest is bad resumes from the one before; the others run; the sweep then ends in one
    line, exit 2. The dry run lists them all the same way."""
    from aioareal.cli import main
    from aioareal.run import recipe

    spec, root = write_spec(tmp_path), tmp_path / "runs"
    runs = {r.name: r.run_dir for r in plan(spec, root)[1]}
    cut = _checkpoint(runs["mode=sync_seed=0"], 3, '{"step": 3, "cur')
    _checkpoint(runs["mode=sync_seed=1"], 1, json.dumps({"step": 1, "cursor": 0, "elapsed": 0.0}))
    _checkpoint(runs["mode=sync_seed=1"], 2, '["not", "an object"]')

    assert main(["sweep", str(spec), "--dry-run", "--runs-root", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any("mode=sync_seed=0" in line and "skipped" in line and str(cut) in line for line in out), out
    assert any("mode=sync_seed=1" in line and "resume from step 1" in line for line in out), out
    assert sum(line.rstrip().endswith(" new") for line in out) == 2, out

    from aioareal.lab.experiments.sweep import SweepIncomplete, run_sweep

    calls = []
    monkeypatch.setattr(recipe, "train", lambda config, **kw: calls.append(("train", config.run.run_dir)))
    monkeypatch.setattr(recipe, "resume", lambda run_dir, **kw: calls.append(("resume", str(run_dir))))
    lines: list[str] = []
    with pytest.raises(SweepIncomplete, match=r"1 of 4 runs skipped.*mode=sync_seed=0") as info:
        run_sweep(spec, root, log=lines.append)
    assert "\n" not in str(info.value)
    assert [kind for kind, _ in calls] == ["resume", "train", "train"]
    assert calls[0][1] == str(runs["mode=sync_seed=1"])
    assert any(line.startswith("warning: ") and str(cut) in line for line in lines), lines
    assert cut.read_text() == '{"step": 3, "cur'  # left as it was
