"""One thread budget per run: training's tool box and every evaluation's share the run's threads, so
tools stuck past their timeout cannot take `tools.max_threads` more threads per evaluation."""
from __future__ import annotations

import asyncio
import threading

from aioareal.config import load_config
from aioareal.episodes import EpisodeSetup, codec_for, load_episode
from aioareal.models.shapes import build_char_tokenizer
from aioareal.tools import Tool, ToolBox, ToolThreads

RELEASE = threading.Event()


def hangs(arg: str) -> str:
    RELEASE.wait(60)
    return "late"


def test_boxes_that_share_the_run_threads_share_one_stuck_budget() -> None:
    shared = ToolThreads(max_threads=2)
    boxes = [ToolBox([Tool("hang", hangs, 0.05)], seed=i, shared=shared) for i in range(5)]  # training + 4 evals

    async def calls() -> list:
        return [await box.call("hang", "x") for box in boxes for _ in range(3)]
    try:
        results = asyncio.run(calls())
        threads = shared.threads.threads
    finally:
        RELEASE.set()
    assert threads == 2  # not 2 per box
    assert sum(r.error == "timeout" for r in results) == 2  # the rest fail fast: every thread is stuck
    assert "still running calls that overran" in results[-1].text
    assert [b.stats.calls for b in boxes] == [3] * 5  # counters stay each box's own


def test_every_box_of_an_episode_run_uses_the_run_threads() -> None:
    config = load_config(overrides=["data.episode=calculator", "tools.max_threads=3"])
    codec = codec_for(build_char_tokenizer(), False)
    setup = EpisodeSetup("calculator", load_episode("calculator"), codec, config.tools, config.data.episode_timeout_s,
                         config.run.seed)
    training, evaluation, later = setup.toolbox(), setup.toolbox(seed_offset=1), setup.toolbox(seed_offset=1)
    assert training.threads is evaluation.threads is later.threads and training.threads.limit == 3
    assert training.stats is not evaluation.stats
