"""`loop_lag_max` (run/events.py LoopLag): the worst lateness of the run's event loop between rows,
near zero on a free loop, and as long as the block when a coroutine blocks it."""
from __future__ import annotations

import asyncio
import time

from aioareal.run.events import LoopLag


def test_a_blocked_loop_shows_as_lag_and_a_free_one_does_not():
    async def scenario() -> tuple[float, float]:
        lag = LoopLag()
        watcher = asyncio.create_task(lag.watch())
        await asyncio.sleep(0.2)
        free = lag.take()
        time.sleep(0.4)  # a blocking call on the loop's thread, as a misplaced reward function makes
        await asyncio.sleep(0.1)
        blocked = lag.take()
        watcher.cancel()
        return free, blocked

    free, blocked = asyncio.run(scenario())
    assert blocked >= 0.35 and free < blocked  # the block is a lower bound; nothing about speed is asserted


def test_every_metrics_row_of_a_run_has_it(tmp_path, tiny_model_path):
    import json

    from aioareal.config import load_config
    from aioareal.run.recipe import train

    config = load_config(None, ["train.steps=2", "algo.batch_groups=2", "algo.group_size=2",
                                f"run.run_dir={tmp_path / 'run'}", "run.dashboard=off"])
    run_dir = train(config, log=lambda *_: None, printer=lambda row: None)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(isinstance(r["loop_lag_max"], float) and r["loop_lag_max"] >= 0 for r in rows)


def test_a_loop_blocked_past_the_stall_timeout_is_named_by_the_watchdog():
    """The watchdog thread sees a loop that stopped ticking and calls its exit with the cause (the
    real exit ends the process: nothing on a blocked loop can run to stop it)."""
    said: list[str] = []

    async def scenario() -> None:
        lag = LoopLag(stall_s=0.3, exit=said.append)
        watcher = asyncio.create_task(lag.watch())
        with lag.watchdog():
            await asyncio.sleep(0.5)  # a free loop ticks: no stall however long it runs
            assert said == []
            time.sleep(1.2)  # blocked, as by an on_step callback that never returns
            await asyncio.sleep(0.05)
        watcher.cancel()

    asyncio.run(scenario())
    assert len(said) == 1 and "the event loop has been blocked for" in said[0]
    assert "run.stall_timeout_s=0.3" in said[0] and "--resume" in said[0]


def test_a_stalled_process_exits_with_the_cause_in_one_line():
    """What ends a run whose hung call never returns: status 3 and one line, after the grace."""
    import subprocess
    import sys

    code = ("import threading, time\nfrom aioareal.loops import exit_unless\n"
            "exit_unless(threading.Event(), 'a generator step has not returned', grace_s=0.1)\ntime.sleep(30)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stderr.strip() == "error: a generator step has not returned; exiting (status 3)"
