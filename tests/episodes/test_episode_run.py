"""A user writes an episode in a file and trains it from the command line; its metrics and samples
show the turns, the tool calls and their errors; a bad tool or a bad episode never stops the run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aioareal.config import load_config
from aioareal.monitor.dashboard import render
from aioareal.monitor.metrics import LiveState
from aioareal.run.recipe import train

EPISODE = '''
import asyncio

async def ask_twice(example, gen):
    """Two model turns with a tool's answer between them; the tool fails on every third call."""
    first = await gen.turn(stop=["5"], max_tokens=3)
    gen.observe(await gen.call("flaky", first.text), role="tool")
    await gen.turn(max_tokens=2)
    if gen.index == 0:
        raise ValueError("an episode bug in one sample of each group")
    return 1.0 if "1" in gen.text else 0.0
'''

TOOLS = '''
import asyncio
calls = 0

async def flaky(arg):
    global calls
    calls += 1
    if calls % 3 == 0:
        raise RuntimeError("the world is down")
    await asyncio.sleep(0.001)
    return "=" + arg[::-1]
'''

BASE = ["model.name=random:tiny", "algo.batch_groups=2", "algo.group_size=4", "data.eval_size=4",
        "generation.max_new_tokens=40", "run.dashboard=off"]


def write_files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "env.py").write_text(EPISODE)
    (tmp_path / "mytools.py").write_text(TOOLS)
    return tmp_path / "env.py", tmp_path / "mytools.py"


def test_an_episode_file_trains_from_the_command_line(tmp_path):
    env, tools = write_files(tmp_path)
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "aioareal", "--steps", "3", "--run-dir", str(run_dir), *BASE,
                             f"data.episode={env}:ask_twice", f"tools.functions={tools}:flaky", "eval.every=0"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "episodes: " in result.stdout and "tools calculator, flaky" in result.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 3 and all(r["turns_mean"] == 2.0 for r in steps)
    assert sum(r["tool_calls"] for r in steps) == 24 and sum(r["tool_errors"] for r in steps) >= 1
    assert all(r["obs_tokens_mean"] > 0 and r["tool_latency_mean"] > 0 for r in steps)
    assert steps[-1]["tool_errors_total"] >= 1 and steps[-1]["tool_calls_total"] >= 24
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert all([t["role"] for t in s["turns"]] == ["assistant", "tool", "assistant"] for s in samples)
    failed = [c for s in samples for c in s["tool_calls"] if c["error"]]
    assert failed and all(c["error"] == "raised" for c in failed)
    assert any(t["text"].startswith("error: the world is down") for s in samples for t in s["turns"])


def test_episode_errors_are_counted_and_shown_once(tmp_path):
    env, tools = write_files(tmp_path)
    config = load_config(overrides=[*BASE, "train.steps=4", f"run.run_dir={tmp_path / 'run'}", "eval.every=0",
                                    f"data.episode={env}:ask_twice", f"tools.functions={tools}:flaky"])
    lines: list[str] = []
    run_dir = train(config, log=lines.append, printer=lambda row: None)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 4 and rows[-1]["episode_errors"] >= 4 * 2  # one per group, at least 8 groups
    shown = [line for line in lines if "raised ValueError: an episode bug" in line]
    training = [line for line in shown if not line.startswith("held-out evaluation: ")]
    assert len(training) == 1 and "Traceback" in training[0] and "env.py" in training[0]
    assert len(shown) == 2  # and the evaluations' first (steps 0 and 4), once for the run
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert all(s["reward"] == 0.0 for s in samples[::4])  # the failing sample of each group scored 0


def test_the_dashboard_shows_episodes_and_tools():
    live = LiveState("ep", "async", 2, "ppo", [], 10)
    live.record({"step": 3, "reward_mean": 0.5, "turns_mean": 2.5, "obs_tokens_mean": 7.0, "tool_calls": 12,
                 "tool_errors": 1, "tool_latency_mean": 0.125, "episode_errors": 0})
    from rich.console import Console

    console = Console(width=100, record=True)
    console.print(render(live.refresh()))
    text = console.export_text()
    assert "episodes 2.50 turns  ·  7.0 obs tok  ·  0 err" in text and "12 calls  ·  1 errors  ·  125 ms" in text


@pytest.mark.parametrize("override, message", [
    ("data.episode=nope.py:ep", "error: episode 'nope.py:ep': no such file nope.py"),
    ("data.episode=missing_module_xyz:ep", "error: episode 'missing_module_xyz:ep': no module named"),
    ("tools.names=calc", "error: config key 'tools.names': unknown tool 'calc'"),
    ("tools.latency_ms=200,50", "error: config key 'tools.latency_ms': must be [] or [ms] or [lo, hi]"),
])
def test_bad_episode_settings_are_one_line_errors(override, message, tmp_path):
    extra = [] if override.startswith("data.episode") else ["data.episode=calculator"]
    result = subprocess.run([sys.executable, "-m", "aioareal", "--run-dir", str(tmp_path / "run"), *BASE, *extra,
                             override], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
