"""`eval` reads a run and leaves it as it found it (issue 49): an unreadable latest checkpoint is
skipped with a warning naming it, never renamed, and the one before it is scored; an evaluation
killed half-way leaves the previous eval.jsonl and figures.json pair whole."""
from __future__ import annotations

import json

import pytest

from aioareal.cli import main
from aioareal.config import load_config
from aioareal.run.recipe import train


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, tiny_model_path):
    run_dir = tmp_path_factory.mktemp("reader") / "run"
    config = load_config(None, ["train.steps=2", "algo.batch_groups=2", "eval.every=0", "run.checkpoint_every=1",
                                f"run.run_dir={run_dir}", "run.dashboard=off"])
    train(config, log=lambda *_: None, printer=lambda row: None)
    return run_dir


def test_an_unreadable_latest_checkpoint_is_skipped_aloud_and_left_in_place(two_checkpoints, tmp_path, capsys):
    latest = two_checkpoints / "checkpoints" / "step-000002"
    weights = next((latest / "policy").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])  # a torn file
    before = sorted(p.name for p in (two_checkpoints / "checkpoints").iterdir())
    assert main(["eval", str(two_checkpoints), "data.eval_size=4", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert f"warning: checkpoint {latest} is unreadable" in err and "using the one before it" in err
    assert sorted(p.name for p in (two_checkpoints / "checkpoints").iterdir()) == before  # nothing renamed
    figures = json.loads((tmp_path / "out" / "figures.json").read_text())
    assert figures["targets"][0]["model"].endswith("step-000001/policy")


def test_a_killed_evaluation_keeps_the_previous_rows_and_figures(two_checkpoints, tmp_path, monkeypatch):
    from aioareal.use import eval_command

    out = tmp_path / "out"
    assert main(["eval", "tiny", "data.eval_size=4", "--out", str(out)]) == 0
    rows, figures = (out / "eval.jsonl").read_text(), (out / "figures.json").read_text()
    real = eval_command.evaluate_target

    def killed(target, config, start, args, new_tokens, records, journal):
        real(target, config, start, args, new_tokens, records, journal)  # one target's rows written, then the kill
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_command, "evaluate_target", killed)
    assert main(["eval", "tiny", "tiny", "data.eval_size=4", "--out", str(out)]) == 130
    assert (out / "eval.jsonl").read_text() == rows and (out / "figures.json").read_text() == figures
