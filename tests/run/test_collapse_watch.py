"""The collapse warning (run/events.py CollapseWatch): one line, once, when a step's entropy falls
below 30% of what it was ten steps before or the held-out score below half its best; quiet on a
run that learns (entropy narrowing slowly), on noise, and on rows without the figures (nulls, NaN)."""
from __future__ import annotations

import asyncio
import math

from hypothesis import given
from hypothesis import strategies as st

from aioareal.run.events import CollapseWatch, RunHooks


def lines(rows: list[dict]) -> list[str]:
    watch = CollapseWatch()
    return [line for row in rows for line in watch.see(row)]


def test_an_entropy_cliff_is_said_once():
    entropies = [2.6, 2.5, 2.7, 2.2, 1.4, 0.8, 0.6, 0.5]
    said = lines([{"step": i + 1, "entropy": e} for i, e in enumerate(entropies)])
    assert said == ["warning: step 7: entropy 0.60 nats, 23% of its 2.60 6 steps before: the policy may be collapsing; "
                    "stop the run (Ctrl-C keeps a checkpoint) and lower algo.lr or algo.embedding_lr_scale "
                    "(docs/models.md#gemma-3-270m)"]


def test_a_cliff_while_the_reward_rises_is_a_policy_settling_not_collapsing():
    entropies, rewards = [2.3, 2.2, 1.8, 1.2, 0.8, 0.5, 0.4], [0.0, 0.05, 0.2, 0.5, 0.7, 0.8, 0.85]
    rows = [{"step": i, "entropy": e, "reward_mean": r} for i, (e, r) in enumerate(zip(entropies, rewards))]
    assert lines(rows) == []
    # The same cliff with the reward flat or falling (Gemma at lr 1e-5) is said.
    flat = lines([{"step": i, "entropy": e, "reward_mean": 0.25 - 0.03 * i} for i, e in enumerate(entropies)])
    assert len(flat) == 1 and flat[0].startswith("warning: step 5: entropy 0.50 nats")


def test_a_held_out_fall_is_said_once():
    said = lines([{"step": 0, "eval_pass_rate": 0.25}, {"step": 5, "eval_pass_rate": 0.31},
                  {"step": 10, "eval_pass_rate": 0.02}, {"step": 15, "eval_pass_rate": 0.0}])
    assert len(said) == 1 and said[0].startswith("warning: step 10: held-out score 0.020, down from its best 0.310")


@given(st.lists(st.floats(0.9, 1.1), min_size=1, max_size=60), st.lists(st.floats(0.3, 0.5), max_size=10))
def test_a_run_that_learns_or_wanders_is_not_warned(entropies, scores):
    # Entropy narrowing by 5% a step, with noise: a fifth of its start after 30 steps, never a cliff.
    rows = [{"step": i, "entropy": 2.0 * e * 0.95 ** i} for i, e in enumerate(entropies)]
    rows += [{"step": i, "eval_pass_rate": s} for i, s in enumerate(sorted(scores))]
    assert lines(rows) == []


def test_rows_without_the_figures_are_skipped():
    assert lines([{"step": 1, "entropy": None}, {"step": 2, "entropy": math.nan}, {"step": 3},
                  {"step": 4, "eval_pass_rate": None}]) == []


def test_the_hooks_say_it_through_their_warn_callable():
    said: list[str] = []

    class Report:
        def __init__(self, step: int, entropy: float) -> None:
            self.row, self.samples, self.step, self.groups = {"step": step, "entropy": entropy}, [], step, []

    async def save(state) -> None:
        return None

    hooks = RunHooks(lambda row: None, lambda rows: None, lambda report: None, save, 0, 10, warn=said.append)
    for step, entropy in enumerate([3.0, 3.0, 3.0, 0.5], start=1):
        asyncio.run(hooks.on_step(Report(step, entropy)))
    assert len(said) == 1 and said[0].startswith("warning: step 4: entropy 0.50 nats")
