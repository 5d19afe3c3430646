"""Users' code bounded everywhere it runs (docs/reliability.md, user code): reward functions under their
deadline and isolation in the check before training and in evaluation too, plain tools on a bounded set
of threads, async tools off the run's event loop, reward workers under a memory limit.

Each test would hang or fail without its bound; the `within` guard turns a hang into a failure, and
its bound is generous (the machine's cores are shared): the deadlines under test are fractions of a second."""
from __future__ import annotations

import asyncio
import json
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from loop_gaps import with_longest_gap

from aioareal.config import load_config
from aioareal.errors import ConfigError, UserError
from aioareal.evaluation.scored_completions import EvalSet, build_evaluator
from aioareal.group import Example
from aioareal.isolation.pool import WorkerPool
from aioareal.rewards.reward_functions import ProcessRewards
from aioareal.rewards.service import RewardService
from aioareal.run.build import task_from
from aioareal.tools import Tool, ToolBox

RELEASE = threading.Event()  # lets in-process hangs of this module's tools end once their test is over


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn()'s result (or its exception, raised here), failing the test if it has not returned in `seconds`."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test's thread
            box["error"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds}s: the call hangs"
    if "error" in box:
        raise box["error"]
    return box["value"]


def rewards_file(tmp_path: Path, code: str) -> Path:
    path = tmp_path / "user_rewards.py"
    path.write_text(textwrap.dedent(code), encoding="utf-8")
    return path


def file_config(tmp_path: Path, *overrides: str):
    rows = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(20)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return load_config(overrides=["data.task=file", f"data.path={data}", "data.eval_size=4",
                                  "generation.max_new_tokens=3", *overrides])


HANGS = """\
import time

def hangs(completions, **kwargs):
    time.sleep(600)
    return [1.0] * len(completions)
"""

HANGS_ON_MODEL_TEXT = """\
import time

def picky(completions, answer, **kwargs):
    if completions[0] != answer[0]:  # the check's completions are the answers; a model's are not
        time.sleep(600)
    return [1.0] * len(completions)
"""


# --- item 2: reward functions keep their deadline outside training ----------------------------------

@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_reward_that_hangs_in_the_check_before_training_is_one_line(tmp_path: Path, isolation: str) -> None:
    spec = f"{rewards_file(tmp_path, HANGS)}:hangs"
    task = task_from(file_config(tmp_path, f"reward.functions={spec}", "reward.timeout_s=0.3",
                                  f"reward.isolation={isolation}", "reward.workers=1"))
    with pytest.raises(UserError) as err:
        within(60, task.splits)
    message = str(err.value)
    assert "\n" not in message and getattr(err.value, "exit_code", None) == 2
    assert message.startswith(f"reward function '{spec}' did not return within reward.timeout_s=0.3s"), message


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_reward_that_hangs_in_evaluation_scores_0_and_is_counted(tmp_path: Path, isolation: str) -> None:
    from engine_helpers import tiny

    # 1 s: the check before training imports the user's file in a worker within the deadline, on busy cores too.
    config = file_config(tmp_path, f"reward.functions={rewards_file(tmp_path, HANGS_ON_MODEL_TEXT)}:picky",
                         "reward.timeout_s=1", f"reward.isolation={isolation}", "reward.workers=1")
    task = task_from(config)
    within(60, task.splits)  # the check passes: on the answers it returns at once
    examples = [Example(str(i), f"{i}+1=", str(i + 1), {"answer": str(i + 1)}) for i in range(3)]
    eval_set = EvalSet(examples, [[5, 6, 7]] * 3)
    evaluator = build_evaluator(config.eval, config.generation, config.reward, config.run.seed, tiny(), eval_set, task,
                                lambda ids: "model " + str(ids), [1])
    metrics = within(60, evaluator)
    assert metrics["eval_reward_failures"] == 3 and metrics["eval_pass_rate"] == 0.0


def test_reward_memory_limit_is_a_config_key() -> None:
    assert load_config(overrides=[]).reward.memory_limit_mb == 4096
    with pytest.raises(ConfigError, match="reward.memory_limit_mb"):
        load_config(overrides=["reward.memory_limit_mb=-1"])


# --- item 9: tools and episodes cannot take the run's threads or loop -------------------------------

def hangs_until_released(arg: str) -> str:
    RELEASE.wait(60)
    return "late"


def test_fifty_calls_of_a_hanging_plain_tool_take_a_bounded_number_of_threads() -> None:
    box = ToolBox([Tool("hang", hangs_until_released, 0.05)], max_threads=4)
    before = threading.active_count()

    async def calls() -> list:
        return [await box.call("hang", str(i)) for i in range(50)]
    try:
        results = within(120, lambda: asyncio.run(calls()))
        grown = threading.active_count() - before
    finally:
        RELEASE.set()
    assert all(r.error is not None for r in results)  # every call is an error observation
    assert grown <= 4 + 1, grown  # the pool's 4 (asyncio.run's own loop may hold one more briefly)
    assert box.stats.calls == 50 and box.stats.timeouts + box.stats.errors == 50
    assert box.stats.timeouts == 4 and "still running calls that overran" in results[-1].text  # the rest fail fast


async def blocks_its_loop(arg: str) -> str:
    time.sleep(10)  # a synchronous sleep inside an async tool
    return "late"


async def answers(arg: str) -> str:
    await asyncio.sleep(0)
    return "ok " + arg


def test_an_async_tool_that_blocks_fails_and_the_run_loop_keeps_ticking() -> None:
    box = ToolBox([Tool("blocks", blocks_its_loop, 0.2), Tool("answers", answers, 5.0)])

    async def calls() -> tuple[Any, Any]:
        blocked = await box.call("blocks", "")
        return blocked, await box.call("answers", "x")  # a fresh loop: the blocked one is written off

    async def go() -> tuple[Any, Any, float]:
        (blocked, after), worst_gap = await with_longest_gap(calls())
        return blocked, after, worst_gap

    blocked, after, worst_gap = within(60, lambda: asyncio.run(go()))
    assert blocked.error == "timeout" and box.stats.timeouts == 1
    assert after.error is None and after.text == "ok x"
    assert worst_gap < 5.0, worst_gap  # the tool's sleep held its own loop for 10 s, not the run's


# --- item 9c: reward workers under a memory limit ----------------------------------------------------

HOG = """\
def hog(completions, **kwargs):
    return [float(len(bytearray(1 << 30)) > 0) if c == "big" else 1.0 for c in completions]
"""


def test_a_reward_that_allocates_past_the_memory_limit_is_a_counted_error(tmp_path: Path) -> None:
    """A 1 GiB allocation in a worker capped at 300 MiB: MemoryError there, a counted error here, the
    worker replaced, and the next call scored as usual."""
    spec = f"{rewards_file(tmp_path, HOG)}:hog"
    pool = WorkerPool(1, ProcessRewards.worker_preload, memory_limit_mb=300)
    service = RewardService(ProcessRewards([spec]), decode=str, workers=1, timeout_s=30.0, pool=pool)
    ex = Example("0", "p", "a", {"answer": "a"})
    try:
        assert pool.wait_ready(60)
        assert within(90, lambda: asyncio.run(service.score(["big"], [ex]))) == ([0.0], 1)
        assert service.stats.errors == 1 and service.stats.timeouts == 0
        assert within(90, lambda: asyncio.run(service.score(["small"], [ex]))) == ([1.0], 0)
        assert pool.restarts == 1  # the worker that ran out exited and was replaced
    finally:
        pool.close()


def test_bounded_threads_queue_work_beyond_the_limit_and_refuse_only_when_all_are_stuck() -> None:
    from aioareal.isolation.threads import BoundedThreads, Saturated

    threads = BoundedThreads(3, "test")
    quick = [threads.submit(lambda i=i: i * i) for i in range(20)]  # more calls than threads: they queue
    assert [f.result(timeout=30) for f in quick] == [i * i for i in range(20)] and threads.threads <= 3
    gate = threading.Event()
    stuck = [threads.submit(lambda: gate.wait(60)) for _ in range(3)]
    deadline = time.monotonic() + 30
    while not all(f.running() for f in stuck) and time.monotonic() < deadline:
        time.sleep(0.01)
    for f in stuck:
        threads.abandon(f)  # their callers gave up while they ran: the threads stay held
    assert threads.stuck == 3
    with pytest.raises(Saturated):
        threads.submit(lambda: 1)
    gate.set()
    assert all(f.result(timeout=30) for f in stuck)
    assert threads.submit(lambda: 7).result(timeout=30) == 7 and threads.threads == 3
