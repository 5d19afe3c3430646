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
