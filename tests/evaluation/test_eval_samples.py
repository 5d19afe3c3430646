"""The in-run evaluation keeps its completions (eval_samples.jsonl, one row per held-out completion
per evaluation) and samples with eval.samples (eval_pass_at_<k> in metrics.jsonl); `samples --eval`
reads them, `--last` keeps the last step, `--best` puts the later step first on ties."""
from __future__ import annotations

import json

import pytest

from aioareal.cli import main
from aioareal.evaluation.scored_completions import sampled_metrics

PROMPTS, SAMPLES = 4, 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tmp_path_factory.mktemp("evalsamples") / "run"
    assert main(["model.name=random:tiny", "--steps", "1", "algo.batch_groups=2", "eval.every=0",
                 f"data.eval_size={PROMPTS}", f"eval.samples={SAMPLES}", "eval.temperature=0.7", "--no-dashboard",
                 "--run-dir", str(run)]) == 0
    return run


def test_every_evaluation_keeps_its_completions(run):
    rows = [json.loads(line) for line in (run / "eval_samples.jsonl").read_text().splitlines()]
    assert [sum(r["step"] == s for r in rows) for s in (0, 1)] == [PROMPTS * (1 + SAMPLES)] * 2  # start and end
    assert sum(r["greedy"] for r in rows) == 2 * PROMPTS
    assert {"step", "prompt_id", "greedy", "sample", "reward", "text", "length", "truncated"} <= set(rows[0])


def test_sampled_evaluation_puts_pass_at_k_in_the_metrics(run):
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "eval_pass_rate" in r]
    assert len(evals) == 2 and all({"eval_pass_at_1", "eval_pass_at_2"} <= set(r) for r in evals)
    assert all(0 <= r["eval_pass_at_1"] <= r["eval_pass_at_2"] <= 1 for r in evals)


def test_pass_at_k_of_the_rows_by_hand():
    rows = [{"reward": r, "length": 1, "truncated": False} for r in (1.0, 0.0, 0.0, 0.0, 1.0, 1.0)]
    figures = sampled_metrics(rows, 2)  # prompts: (1, 0), (0, 0), (1, 1)
    assert figures["eval_pass_at_1"] == pytest.approx(0.5)
    assert figures["eval_pass_at_2"] == pytest.approx(2 / 3)


def test_samples_reads_the_evaluations(run, capsys):
    capsys.readouterr()
    assert main(["samples", str(run), "--eval", "--last", "-n", "0"]) == 0
    heads = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(heads) == PROMPTS * (1 + SAMPLES) and all(h.startswith("step 1 · eval ") for h in heads)
    assert main(["samples", str(run), "--eval", "--best", "-n", "1"]) == 0
    best = capsys.readouterr().out
    rows = [json.loads(line) for line in (run / "eval_samples.jsonl").read_text().splitlines()]
    top = max(r["reward"] for r in rows)
    expected_step = max(r["step"] for r in rows if r["reward"] == top)  # ties: the later step
    assert best.startswith(f"step {expected_step} · eval ")
