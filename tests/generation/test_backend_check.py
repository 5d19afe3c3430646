"""No run trains on a silently different model (generation/backends.py, trainer/trainer.py): the
start-up check compares the chosen backend's log-probs with the model's own forward on the real
weights, and refuses (`engine`) or falls back (`auto`) when an engine layer is broken; the per-step
`logprob_gap_max` bound (train.max_logprob_gap) stops a run whose generator drifts off."""
from __future__ import annotations

import json
import math

import pytest
import torch
from engine_helpers import tiny

from aioareal.config import load_config
from aioareal.errors import UserError
from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.generation.backends import HFEngine, checked, gap_bound, startup_gap
from aioareal.generation.forward import FastForward
from aioareal.run import recipe
from aioareal.run.recipe import train
from aioareal.trainer.trainer import check_gap

SMALL = ["train.steps=1", "eval.every=0", "algo.batch_groups=2", "algo.group_size=2",
         "model.dtype=float32"]


def break_engine_mlp(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately wrong engine layer: its MLP output scaled by 1.5 (the HF forward is untouched)."""
    mlp = FastForward._mlp
    monkeypatch.setattr(FastForward, "_mlp", lambda self, i, layer, h: 1.5 * mlp(self, i, layer, h))


def run(tmp_path, *overrides: str, lines: list[str] | None = None) -> list[dict]:
    config = load_config(overrides=[*SMALL, *overrides], flags={"run.run_dir": str(tmp_path / "run")})
    run_dir = train(config, log=(lines.append if lines is not None else lambda *_: None), printer=lambda row: None)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_startup_gap_is_float_rounding_for_both_backends_and_large_for_a_broken_layer(monkeypatch):
    model = tiny(scale=4)
    params = SamplingParams(max_new_tokens=8)
    prompt = [5, 17, 42, 9, 77]
    options = EngineOptions(2, 32, params, fuse=False)
    for backend in (Engine(model, [], options), HFEngine(model, [], options)):
        assert startup_gap(backend, model, prompt) < 1e-4
        assert backend.tokens_generated == backend.decode_tokens == 0 and not backend.busy  # the check leaves no trace
    break_engine_mlp(monkeypatch)
    assert startup_gap(Engine(model, [], options), model, prompt) > gap_bound(torch.float32)


def test_broken_engine_layer_refused_under_engine(tmp_path, monkeypatch, tiny_model_path):
    break_engine_mlp(monkeypatch)
    with pytest.raises(UserError, match=r"generation: model_type qwen2: the engine's log-probs differ from the "
                                        r"model's own forward by [0-9.e-]+ nats \(bound 0.001"):
        run(tmp_path, "generation.backend=engine")


def test_broken_engine_layer_falls_back_under_auto(tmp_path, monkeypatch, tiny_model_path):
    break_engine_mlp(monkeypatch)
    lines = []
    rows = run(tmp_path, "generation.backend=auto", lines=lines)
    said = [line for line in lines if "runs on the HF fallback backend (slower)" in line]
    assert len(said) == 1 and "model_type qwen2" in said[0] and "start-up check" in said[0], lines
    assert rows[-1]["step"] == 1 and rows[-1]["logprob_gap_max"] < 1e-3  # trained on the model's own log-probs


def test_per_step_gap_bound_stops_a_run_that_drifts(tmp_path, monkeypatch, tiny_model_path):
    """With the start-up check bypassed, the broken engine samples from another model: the first
    step's logprob_gap_max passes the fp32 bound (0.05) and the run stops with one line."""
    break_engine_mlp(monkeypatch)
    monkeypatch.setattr(recipe, "check_engine", lambda config, engine, *args: engine)
    with pytest.raises(UserError, match=r"step 1: logprob_gap_max [0-9.]+ nats exceeds train.max_logprob_gap=0.05"):
        run(tmp_path, "generation.backend=engine")


def test_check_gap_bound():
    check_gap(0.01, 0.05, 3)
    check_gap(math.nan, 0.05, 3)  # no token of the trainer's version: nothing to compare
    with pytest.raises(UserError, match="step 3: logprob_gap_max 0.2 nats exceeds train.max_logprob_gap=0.05"):
        check_gap(0.2, 0.05, 3)


def test_a_model_whose_own_code_fails_on_the_fallback_is_refused_in_one_line(monkeypatch):
    """MPT once broke here (its forward needed an explicit mask): whatever a family's own code
    raises during the start-up check becomes one line naming the model type, not a traceback."""
    model = tiny()
    options = EngineOptions(2, 32, SamplingParams(max_new_tokens=8), fuse=False)

    def broken(self, tokens, cache):
        raise AttributeError("'NoneType' object has no attribute 'to'")

    monkeypatch.setattr(HFEngine, "_forward", broken)
    with pytest.raises(UserError, match=r"^generation: model_type qwen2: the HF fallback backend cannot run this "
                                        r"model \(AttributeError: 'NoneType' object has no attribute 'to'\)$"):
        checked(HFEngine(model, [], options), model, [5, 17, 42], "hf", lambda: HFEngine(model, [], options), print)
