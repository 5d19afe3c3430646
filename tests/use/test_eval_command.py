"""`python -m aioareal eval`: a tiny run trained for two steps, scored against its base in one table;
eval.jsonl holds every completion; the figures' JSON line parses and its pass@k matches a brute-force
count over the written verdicts; the end of the run says where the policy is."""
from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
from pathlib import Path

import pytest

from aioareal.cli import main
from aioareal.config import load_config
from aioareal.run.recipe import train
from aioareal.use.eval_report import Progress, json_line, table

N, PROMPTS = 4, 6


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_model_path) -> tuple[Path, list[str]]:
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    said: list[str] = []
    config = load_config(None, ["train.steps=2", "algo.batch_groups=2", "eval.every=0", f"run.run_dir={run_dir}",
                                "run.dashboard=off"])
    train(config, log=said.append, printer=lambda row: None)
    return run_dir, said


@pytest.fixture(scope="module")
def evaluated(trained_run, tmp_path_factory):
    run_dir, _ = trained_run
    out = tmp_path_factory.mktemp("eval-out")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["eval", "tiny", str(run_dir), "-n", str(N), f"data.eval_size={PROMPTS}", "--out", str(out)])
    return code, stdout.getvalue(), out


def test_the_end_of_a_run_names_its_policy_and_the_commands(trained_run):
    run_dir, said = trained_run
    text = "\n".join(said)
    assert f"{run_dir}/checkpoints/step-000002/policy" in text
    assert f"python -m aioareal eval tiny {run_dir}" in text and f"python -m aioareal chat {run_dir}" in text


def test_eval_prints_both_targets_in_one_table(evaluated, trained_run):
    code, stdout, _ = evaluated
    assert code == 0
    header = next(line for line in stdout.splitlines() if line.startswith("figure"))
    assert "tiny" in header and str(trained_run[0]) in header
    for label in ("pass@1 greedy", f"pass@1 sampled (n={N})", "pass@2", "pass@4", "maj@4", "cut off, sampled"):
        assert any(line.startswith(label) for line in stdout.splitlines()), label


def test_eval_writes_every_completion(evaluated):
    _, _, out = evaluated
    rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * PROMPTS * (N + 1)  # targets x prompts x (samples + greedy)
    assert sum(r["greedy"] for r in rows) == 2 * PROMPTS
    fields = {"target", "prompt_id", "sample", "text", "reward", "passed", "answer", "length", "truncated"}
    assert fields <= set(rows[0])


def brute_pass_at_k(passed: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(passed, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_the_figures_line_parses_and_matches_the_completions(evaluated):
    _, stdout, out = evaluated
    figures = json.loads(stdout.splitlines()[-1])
    assert figures == json.loads((out / "figures.json").read_text())
    rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    for column in figures["targets"]:
        mine = [r for r in rows if r["target"] == column["target"] and not r["greedy"]]
        by_prompt = [[r["passed"] for r in mine if r["prompt_id"] == p] for p in dict.fromkeys(r["prompt_id"]
                                                                                             for r in mine)]
        assert len(by_prompt) == PROMPTS and column["prompts"] == PROMPTS
        for k in (1, 2, 4):
            expected = sum(brute_pass_at_k(p, k) for p in by_prompt) / PROMPTS
            assert column[f"pass@{k}"] == pytest.approx(expected)
        greedy = [r for r in rows if r["target"] == column["target"] and r["greedy"]]
        assert column["pass@1_greedy"] == pytest.approx(sum(r["passed"] for r in greedy) / PROMPTS)
        assert 0.0 <= column["maj@4"] <= 1.0 and column["pass@4_se"] is not None


def test_an_unknown_target_is_one_line(capsys):
    assert main(["eval", "no/such/run.gguf"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_progress_is_plain_lines_off_a_terminal_and_silent_for_small_sets():
    out = io.StringIO()
    progress = Progress("tiny greedy", 100, out)
    for _ in range(10):
        progress(10)
    progress.close()
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 4 and lines[-1] == "tiny greedy: 100/100 prompts"
    small = io.StringIO()
    Progress("x", 8, small)(8)
    assert small.getvalue() == ""


def test_the_table_shows_missing_standard_errors_as_plain_values():
    columns = [{"target": "a", "pass@1_greedy": 0.5, "pass@1_greedy_se": math.nan, "length_mean_greedy": 3.0,
                "length_mean_greedy_se": 0.25}]
    text = table(columns, 0)
    assert text.splitlines()[2].split() == ["pass@1", "greedy", "0.500"] and "3.0 ± 0.2" in text
    assert json.loads(json_line({"x": math.nan})) == {"x": None}


def test_a_missing_target_is_refused_before_any_target_is_evaluated(trained_run, monkeypatch, capsys):
    from aioareal.use import eval_command

    monkeypatch.setattr(eval_command, "evaluate_target", lambda *a: pytest.fail("evaluated before the check"))
    assert main(["eval", str(trained_run[0]), "/no/such/policy"]) == 2
    assert capsys.readouterr().err == "error: /no/such/policy: no such run, checkpoint or model directory\n"


REWARDS = '''
def ids_len(completions, completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


def picky(completions, answer, **kwargs):  # passes the pre-check (the answers themselves), fails on others
    if any(c.strip() != a for c, a in zip(completions, answer)):
        raise ValueError("a bug in the user's reward function")
    return [1.0] * len(completions)
'''


def test_reward_functions_get_completion_ids_and_failures_are_reported(trained_run, tmp_path, monkeypatch):
    """As in training (TRL's convention): the token ids reach the user's reward functions, and a
    function that fails is counted and said, not shown as a clean 0."""
    (tmp_path / "eval_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    for function, out in (("ids_len", tmp_path / "ids"), ("picky", tmp_path / "picky")):
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = main(["eval", str(trained_run[0]), "data.eval_size=32", f"reward.functions=eval_rewards:{function}",
                         "--out", str(out)])
        assert code == 0
        rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
        figures = json.loads(stdout.getvalue().splitlines()[-1])["targets"][0]
        if function == "ids_len":
            assert [r["reward"] for r in rows] == [float(r["length"]) for r in rows] and figures["reward_failures"] == 0
        else:
            failed = sum(r["text"].strip() != r["reference"] for r in rows)
            assert 0 < failed < len(rows) and figures["reward_failures"] == failed
            assert [r["reward"] for r in rows] == [float(r["text"].strip() == r["reference"]) for r in rows]
            assert f"warning: {trained_run[0]}: {failed} reward checks failed" in stdout.getvalue()


def test_a_file_task_evaluates_from_its_eval_path_alone(trained_run, tmp_path):
    """eval reads only held-out rows: data.eval_path without data.path (a training file) is enough."""
    rows = tmp_path / "held_out.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(5)))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["eval", str(trained_run[0]), "data.task=file", f"data.eval_path={rows}",
                     "data.prompt_template={question}", "--out", str(tmp_path / "out")])
    assert code == 0 and json.loads(stdout.getvalue().splitlines()[-1])["targets"][0]["prompts"] == 5


def test_a_sample_count_past_what_memory_holds_is_one_line(capsys):
    assert main(["eval", "tiny", "-n", "100000000"]) == 2
    assert capsys.readouterr().err.startswith("error: -n must be in [0, 65536]")
