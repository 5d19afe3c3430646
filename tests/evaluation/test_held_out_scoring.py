"""Held-out completions are scored on one path (evaluation/scored_completions.py) by the in-run
evaluation and the `eval` command alike: the reward service, with training's reward functions,
weights, isolation and deadline, every prompt's call at once (issues 48 and 49).

The hang test bounds the wall clock, as the freeze detectors do (docs/architecture.md#layers): a
bound far above one deadline and far below a deadline per prompt, which is what scoring the prompts
one after another costs."""
from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path

from engine_helpers import tiny

from aioareal.config import load_config
from aioareal.evaluation.scored_completions import EvalSet, build_evaluator
from aioareal.group import Example
from aioareal.isolation.pool import shared_pool
from aioareal.run.build import task_from
from aioareal.run.events import RunHooks

PROMPTS, TIMEOUT_S = 16, 1.0

# Returns at once on the answers (what the check before training passes), hangs on a model's text.
HANGS_ON_MODEL_TEXT = """\
import time

def picky(completions, answer, **kwargs):
    if completions[0] != answer[0]:
        time.sleep(600)
    return [1.0] * len(completions)
"""


def hanging_config(tmp_path: Path):
    rewards = tmp_path / "hanging_rewards.py"
    rewards.write_text(textwrap.dedent(HANGS_ON_MODEL_TEXT), encoding="utf-8")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(40)),
                    encoding="utf-8")
    return load_config(overrides=["data.task=file", f"data.path={rows}", f"data.eval_size={PROMPTS}",
                                  "generation.max_new_tokens=3", f"reward.functions={rewards}:picky",
                                  "reward.isolation=process", f"reward.timeout_s={TIMEOUT_S}", "reward.workers=2"])


def test_a_reward_that_hangs_on_every_held_out_completion_costs_about_one_deadline(tmp_path: Path) -> None:
    config = hanging_config(tmp_path)
    task = task_from(config)  # no check before training: it could time out behind other tests' warm-ups
    examples = [Example(str(i), f"{i}+1=", str(i + 1), {"answer": str(i + 1)}) for i in range(PROMPTS)]
    evaluator = build_evaluator(config.eval, config.generation, config.reward, config.run.seed, tiny(),
                                EvalSet(examples, [[5, 6, 7]] * PROMPTS), task, lambda ids: "model " + str(ids), [1])
    assert shared_pool(config.reward.workers).wait_ready(60)  # workers' start-up is no part of the claim
    # (Jobs queued behind a worker still importing the reward module expire at their deadline too.)
    start = time.monotonic()
    metrics = evaluator()
    took = time.monotonic() - start
    # Scored one prompt after another, the deadlines add up: PROMPTS x TIMEOUT_S = 16 s and more.
    assert took < 0.5 * PROMPTS * TIMEOUT_S, f"{took:.1f}s: the held-out prompts' deadlines ran one after another"
    assert metrics["eval_reward_failures"] == PROMPTS and metrics["eval_pass_rate"] == 0.0


def test_the_run_says_in_one_line_when_held_out_reward_checks_failed() -> None:
    said: list[str] = []

    class Report:
        def __init__(self, step: int, failures: int) -> None:
            self.step, self.samples, self.groups = step, [], []
            self.row = {"step": step, "eval_pass_rate": 0.0, "eval_reward_failures": failures}

    async def save(state) -> None:
        return None

    hooks = RunHooks(lambda row: None, lambda rows: None, lambda report: None, save, 0, 10, warn=said.append)
    asyncio.run(hooks.on_step(Report(0, 0)))
    assert said == []
    asyncio.run(hooks.on_step(Report(5, PROMPTS)))
    assert said == [f"warning: held-out evaluation at step 5: {PROMPTS} reward checks failed (raised, hung past "
                    "reward.timeout_s or returned garbage) and scored 0"]
