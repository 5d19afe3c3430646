"""What `train` leaves behind when it returns (aioareal/run/recipe.py): nothing of the run stays alive,
so a sweep's runs one after another in one process do not pile up models (a stop-signal handler
left on the event loop once kept every run's models, 2.65 GB per SmolLM2 run)."""
from __future__ import annotations

import gc
import signal

import torch

from aioareal.config import load_config
from aioareal.run.recipe import train


def live_models() -> int:
    gc.collect()
    return sum(type(o).__name__.endswith("ForCausalLM") and isinstance(o, torch.nn.Module) for o in gc.get_objects())


def test_a_finished_run_keeps_no_model_alive_and_gives_back_the_signals(tmp_path):
    before = live_models(), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    for name in ("first", "second"):
        config = load_config(overrides=["model.name=random:tiny", "train.steps=2", "algo.batch_groups=2",
                                        "algo.group_size=2", "eval.every=2", "data.eval_size=4"],
                             flags={"run.run_dir": str(tmp_path / name), "run.dashboard": "off"})
        train(config, log=lambda *_: None, printer=lambda row: None)
        assert (live_models(), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_run_says_it_evaluates_step_0_even_with_eval_every_0(tmp_path):
    # eval.every=0 means "at the start and the end", so step 0's evaluation (minutes for a real model
    # on a CPU) still comes first, and the run must say so rather than sit silent.
    lines: list[str] = []
    config = load_config(overrides=["model.name=random:tiny", "train.steps=1", "algo.batch_groups=2",
                                    "algo.group_size=2", "eval.every=0", "data.eval_size=4"],
                         flags={"run.run_dir": str(tmp_path / "run"), "run.dashboard": "off"})
    train(config, log=lambda line, *_: lines.append(str(line)), printer=lambda row: None)
    assert any("evaluating the held-out prompts before any update" in line for line in lines)
