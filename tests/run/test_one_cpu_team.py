"""One OpenMP team for a sync run on the CPU (devices.one_cpu_team, recipe.start_model): the
generator's and the trainer's torch ops run on one shared worker thread at full width, the setup's
thread drops to width 1, and a run whose sides overlap keeps a thread each. The one-thread run's
weight sync keeps no staging copy (weightsync/full.py); an overlapping run's does."""
from __future__ import annotations

import threading

import torch

from aioareal.config import load_config
from aioareal.devices import one_cpu_team
from aioareal.orchestrator import workers
from aioareal.run.recipe import train

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_one_team_only_where_both_sides_take_turns_on_the_cpu():
    assert one_cpu_team([CPU, CPU], overlapping=False)
    assert not one_cpu_team([CPU, CPU], overlapping=True)
    assert not one_cpu_team([CUDA, CPU], overlapping=False)


def _run_and_watch(tmp_path, monkeypatch, mode: list[str]) -> tuple[set, set, int, set]:
    """(generator's (thread, width) pairs, trainer's, the calling thread's width after the run,
    the weight sync's `staged` as the workers saw it)."""
    seen: dict[str, set] = {"gen": set(), "train": set(), "staged": set()}
    for side, cls, name in (("gen", workers.EngineWorker, "_step"), ("train", workers.TrainerWorker, "_train")):
        original = getattr(cls, name)

        def watched(self, *args, _side=side, _original=original):
            seen[_side].add((threading.current_thread().name, torch.get_num_threads()))
            seen["staged"].add(self.sync.staged)
            return _original(self, *args)
        monkeypatch.setattr(cls, name, watched)
    config = load_config(overrides=["model.name=random:tiny", "train.steps=2", "algo.batch_groups=2",
                                    "algo.group_size=2", "eval.every=2", "data.eval_size=4", *mode],
                         flags={"run.run_dir": str(tmp_path / "run"), "run.dashboard": "off"})
    width = torch.get_num_threads()
    seen_after: list[int] = []
    train(config, log=lambda *_: None, printer=lambda row: seen_after.append(torch.get_num_threads()))
    assert torch.get_num_threads() == width  # the caller gets its threads back (threads_restored)
    return seen["gen"], seen["train"], seen_after[-1], seen["staged"]


def test_a_sync_cpu_run_computes_on_one_thread_at_full_width(tmp_path, monkeypatch):
    width = torch.get_num_threads()
    gen, trained, loop_width, staged = _run_and_watch(tmp_path, monkeypatch, [])
    assert gen == trained and len(gen) == 1  # one thread for both sides
    (name, team), = gen
    assert name.startswith("torch") and team == width
    assert loop_width == 1  # the event loop's thread leads no team of its own
    assert staged == {False}  # the generator is idle at every publish: no staging copy


def test_overlapping_sides_keep_a_thread_each(tmp_path, monkeypatch):
    gen, trained, _, staged = _run_and_watch(tmp_path, monkeypatch, ["rollout.mode=async", "rollout.max_staleness=1"])
    assert {n for n, _ in gen} == {"generator_0"} and {n for n, _ in trained} == {"trainer_0"}
    assert staged == {True}  # the trainer publishes while the generator decodes
