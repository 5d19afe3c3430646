"""run.cpu_threads: how the CPU's cores are shared between the generator's and the trainer's threads."""
from __future__ import annotations

import os

import torch

from aioareal.config import load_config
from aioareal.devices import cpu_threads
from aioareal.run.recipe import train

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


def test_auto_splits_the_cores_only_when_both_sides_compute_at_once_on_the_cpu(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert cpu_threads([CPU, CPU], 0, overlapping=True) == 4  # async / one-step: 4 threads per side
    assert cpu_threads([CPU, CPU], 0, overlapping=False) is None  # sync: the sides take turns
    assert cpu_threads([GPU, CPU], 0, overlapping=True) is None  # one side on the CPU keeps every core
    assert cpu_threads([CPU, CPU], 3, overlapping=False) == 3  # an explicit setting wins
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads([CPU, CPU], 0, overlapping=True) is None  # and so does the environment


def test_a_run_gives_the_process_its_threads_back(tmp_path):
    before = torch.get_num_threads()
    config = load_config(overrides=["model.name=random:tiny", "train.steps=1", "algo.batch_groups=2", "eval.every=0",
                                    "rollout.mode=async", "run.cpu_threads=1"],
                         flags={"run.run_dir": str(tmp_path / "r")})
    train(config, log=lambda *_: None, printer=lambda row: None)
    assert torch.get_num_threads() == before
