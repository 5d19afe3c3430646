"""Episodes that never give the model a turn of their own: the run counts them and goes on (no traceback,
no hang), and a held-out evaluation says when its episodes fail instead of going quiet."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import WANDER_EOS, wandering_model  # noqa: I001 -- tests/ helper, as test_episodes.py

from aioareal.config import load_config
from aioareal.episodes import EpisodeContext, EpisodeRunner, TurnQueue, codec_for
from aioareal.episodes.episode_worker import drive
from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.group import Example, Group
from aioareal.models.shapes import build_char_tokenizer
from aioareal.run.recipe import train
from aioareal.tools import build_toolbox

EPISODES = '''
async def fills_the_budget(example, gen):
    while gen.room > 0:
        gen.observe("error: the tool did not answer")
    return 1.0

async def observes_only(example, gen):
    gen.observe("hello")
    return 1.0

async def raises(example, gen):
    raise ValueError("a bug in the episode")
'''

BASE = ["model.name=random:tiny", "algo.batch_groups=2", "algo.group_size=4", "data.eval_size=4",
        "generation.max_new_tokens=8", "run.dashboard=off"]


async def fills_the_budget(example, gen):
    while gen.room > 0:
        gen.observe("error: the tool did not answer")
    return 1.0


async def exact(text: str, example) -> tuple[float, bool]:
    return 0.0, False


def test_observations_that_fill_the_budget_give_up_a_token_for_the_model():
    budget = 8
    prompt = build_char_tokenizer().encode("12*34=", add_special_tokens=False)
    engine = Engine(wandering_model(), WANDER_EOS,
                    EngineOptions(4, len(prompt) + budget, SamplingParams(max_new_tokens=budget), seed=1))
    codec = codec_for(build_char_tokenizer(), False)
    queue = TurnQueue(codec.decode_raw)
    ctx = EpisodeContext(queue, codec, build_toolbox([], [], 1.0, []), exact, budget, 2)
    lines: list[str] = []
    runner = EpisodeRunner(fills_the_budget, ctx, log=lines.append)
    g = Group(0, prompt, 2, Example("0", "12*34=", "408"))
    (rewards, failures), = asyncio.run(drive(engine, queue, [runner.run_group(g)]))
    assert (rewards, failures) == ([0.0, 0.0], 2) and "ended without a model turn" in lines[0]
    for s in g.samples:
        c = s.completion
        assert len(c.tokens) == budget and c.obs_tokens == budget - 1 and s.version_min == 0
        assert all(t.end <= budget - 1 for t in c.turns if t.role != "assistant")


def run_cli(tmp_path: Path, episode: str, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    (tmp_path / "env.py").write_text(EPISODES)
    run_dir = tmp_path / episode
    # A timeout: before the fix, a sync run whose episodes observe before their first turn never
    # adopted a new version, and dropped every group as stale, forever.
    result = subprocess.run([sys.executable, "-m", "aioareal", "--steps", "3", "--run-dir", str(run_dir), *BASE,
                             f"data.episode={tmp_path / 'env.py'}:{episode}", "eval.every=0", *extra],
                            capture_output=True, text=True, timeout=240)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] \
        if result.returncode == 0 else []
    return result, rows


@pytest.mark.parametrize("episode", ["observes_only", "fills_the_budget"])
def test_episodes_without_a_model_turn_are_counted_and_the_sync_run_goes_on(tmp_path, episode):
    result, rows = run_cli(tmp_path, episode, "rollout.mode=sync")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 3 and steps[-1]["episode_errors"] == 3 * 2 * 4  # every episode, counted
    assert all(r["dropped_stale"] == 0 for r in steps)


def test_a_held_out_evaluation_says_its_episodes_failed_and_counts_them(tmp_path):
    (tmp_path / "env.py").write_text(EPISODES)
    config = load_config(overrides=[*BASE, "train.steps=1", f"run.run_dir={tmp_path / 'run'}", "eval.every=1",
                                    f"data.episode={tmp_path / 'env.py'}:raises"])
    lines: list[str] = []
    run_dir = train(config, log=lines.append, printer=lambda row: None)
    shown = [line for line in lines if line.startswith("held-out evaluation: episode")]
    assert shown and "raised ValueError: a bug in the episode" in shown[0]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval_episode_errors"] for r in rows if "eval_episode_errors" in r][-1] == 4
