"""eval --protocol lm-eval (evaluation/lm_eval.py): the prompt, the stop strings and both extractions as
lm-evaluation-harness's gsm8k task (version 3) defines them; an engine that stops at a string; the
command on the committed GSM8K slice, and its refusals (-n without zero-shot, --k above -n, unknown
protocols) in one line each."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from engine_helpers import generate
from hypothesis import given
from hypothesis import strategies as st

from aioareal.cli import main
from aioareal.evaluation import lm_eval
from aioareal.evaluation.scored_completions import common_prefix
from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.generation.scheduler import StopStrings
from aioareal.group import Group
from aioareal.models import random_model

SLICE = Path(__file__).resolve().parents[1] / "data" / "gsm8k"


def test_the_prompt_joins_shots_and_question_as_the_harness_does():
    text = lm_eval.prompt([("q1", "a1\n#### 1"), ("q2", "a2\n#### 2")], "q3")
    assert text == "Question: q1\nAnswer: a1\n#### 1\n\nQuestion: q2\nAnswer: a2\n#### 2\n\nQuestion: q3\nAnswer:"


@pytest.mark.parametrize("completion, strict, flexible", [
    (" She has 3 + 4 = 7 apples.\n#### 7", "7", "7"),
    (" 2 * $1,000 = $2,000.\n#### $2,000", lm_eval.INVALID, "$2,000"),  # strict wants a digit after "#### "
    (" It costs 5 dollars.", lm_eval.INVALID, "5"),
    (" 10 then 12.5.", lm_eval.INVALID, "12.5."),
    (" nothing here", lm_eval.INVALID, lm_eval.INVALID),
    (" #### 1,234.", "1,234.", "1,234."),
    (" #### 8\n#### 9", "8", "9"),  # strict: the first; flexible: the last
    (" -3 degrees\n#### -3", "-3", "-3"),
])
def test_extractions(completion, strict, flexible):
    assert lm_eval.strict_answer(completion) == strict
    assert lm_eval.flexible_answer(completion) == flexible


@pytest.mark.parametrize("answer, reference, same", [
    ("1,234.", "so 1234 in all\n#### 1234", True),
    ("$2,000", "\n#### 2000", True),
    ("2000.0", "#### 2000", False),  # exact match: no numeric equivalence in the harness
    (lm_eval.INVALID, "#### 5", False),
    ("72", "#### 72", True),
])
def test_exact_match_after_the_ignored_patterns(answer, reference, same):
    assert lm_eval.matches(answer, reference) is same


@given(st.text(max_size=60), st.sampled_from(lm_eval.STOP), st.text(max_size=20))
def test_the_text_is_cut_at_the_first_stop_string(head, stop, tail):
    text = lm_eval.cut_at_stop(head + stop + tail)
    assert all(s not in text for s in lm_eval.STOP)
    assert (head + stop + tail).startswith(text) and len(text) <= len(head)


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=30), min_size=1, max_size=6), st.integers(0, 8))
def test_the_common_prefix_is_shared_by_every_prompt_and_maximal(prompts, least):
    shared = common_prefix(prompts, least)
    n = len(shared)
    assert all(len(p) > n and p[:n] == shared for p in prompts) if n else True
    if n:
        assert n >= least
        longer = n + 1
        assert not all(len(p) > longer and p[:longer] == prompts[0][:longer] for p in prompts)


def test_a_plain_group_ends_at_a_stop_string():
    """EngineOptions.stop: the host's check ends a sequence once its text holds a stop string; the
    same sequence runs to its length limit without one."""
    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=0)
    decode = lambda ids: " ".join(map(str, ids))  # noqa: E731  every id is a word: a string can name one
    params = SamplingParams(greedy=True, max_new_tokens=12)
    free = generate(Engine(model, [], EngineOptions(4, 40, params)), [Group(0, [5, 6, 7], 1)])[0]
    tokens = free.completions[0].tokens
    assert len(tokens) == 12
    stop = StopStrings((f" {tokens[4]} ",), decode)  # a word of the free run's fifth token, ended by a space
    ended = generate(Engine(model, [], EngineOptions(4, 40, params, stop=stop)), [Group(0, [5, 6, 7], 1)])[0]
    c = ended.completions[0]
    cut = next(i for i in range(1, 13) if stop.strings[0] in decode(tokens[:i]))
    assert c.finish_reason == "stop_string" and c.tokens == tokens[:cut] and cut < 12


def run_eval(*argv: str) -> tuple[int, str]:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["eval", *argv])
    return code, stdout.getvalue()


GSM8K = ["data.task=gsm8k", f"data.path={SLICE / 'train.jsonl'}", f"data.eval_path={SLICE / 'test.jsonl'}"]


def test_lm_eval_scores_the_slice_as_its_own_section(tiny_model_path, tmp_path):
    code, out = run_eval("tiny", "--protocol", "zero-shot,lm-eval", "data.eval_size=6", "--max-new-tokens", "4",
                         *GSM8K, "--out", str(tmp_path))
    assert code == 0
    lines = out.splitlines()
    assert any(line.startswith("zero-shot: ") for line in lines)
    lm = next(i for i, line in enumerate(lines) if line.startswith("lm-eval: GSM8K 5-shot"))
    assert lines[lm + 1].startswith("strict-match") and lines[lm + 2].startswith("flexible-extract")
    figures = json.loads(lines[-1])
    column = figures["targets"][0]
    assert figures["protocols"] == ["zero-shot", "lm-eval"] and column["lm-eval_prompts"] == 6
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r["protocol"] == "lm-eval"]
    assert len(mine) == 6 and len(rows) == 12
    assert column["lm-eval_strict"] == pytest.approx(sum(r["passed_strict"] for r in mine) / 6)
    for r in mine:
        assert r["strict"] == lm_eval.strict_answer(r["text"]) and all(s not in r["text"] for s in lm_eval.STOP)
        assert r["passed_flexible"] == lm_eval.matches(r["flexible"], r["reference"])


def test_the_lm_eval_prompts_hold_five_train_shots(tmp_path):
    from aioareal.config import load_config
    from aioareal.use.eval_command import lm_eval_set

    config = load_config(None, [*GSM8K, "data.eval_size=3"])
    examples, prompts = lm_eval_set(config)
    train = [json.loads(line) for line in (SLICE / "train.jsonl").read_text().splitlines()][:5]
    test = [json.loads(line) for line in (SLICE / "test.jsonl").read_text().splitlines()][:3]
    assert len(prompts) == 3 and [e.answer for e in examples] == [r["answer"] for r in test]
    expected = lm_eval.prompt([(r["question"], r["answer"]) for r in train], test[0]["question"])
    assert prompts[0] == expected and prompts[0].count("Question: ") == 6


@pytest.mark.parametrize("argv, says", [
    (["--protocol", "few-shot"], "--protocol few-shot: expected one or more of zero-shot, lm-eval"),
    (["-n", "4", "--k", "8"], "--k 8: each k must be between 1 and -n 4"),
    (["--k", "2"], "--k 2: pass@k and maj@k need sampled completions; add -n 2"),
    (["-n", "4", "--k", "two"], "--k two: expected whole numbers"),
    (["-n", "2", "--protocol", "lm-eval"], "-n 2: sampled completions belong to the zero-shot protocol"),
    (["--protocol", "lm-eval"], "--protocol lm-eval scores GSM8K (data.task=gsm8k), not data.task=arithmetic"),
])
def test_refusals_are_one_line(argv, says, capsys, tiny_model_path, tmp_path):
    assert main(["eval", "tiny", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_lm_eval_without_a_train_file_is_refused(capsys, tiny_model_path, tmp_path):
    code = main(["eval", "tiny", "--protocol", "lm-eval", "data.task=gsm8k",
                 f"data.eval_path={SLICE / 'test.jsonl'}", "--out", str(tmp_path)])
    assert code == 2 and "set data.path to the train file" in capsys.readouterr().err


def test_a_chosen_k_is_reported_alone(tiny_model_path, tmp_path):
    code, out = run_eval("tiny", "-n", "4", "--k", "1,3", "data.eval_size=4", "--out", str(tmp_path))
    column = json.loads(out.splitlines()[-1])["targets"][0]
    assert code == 0 and "pass@3" in column and "pass@2" not in column and "pass@4" not in column
    code, out = run_eval("tiny", "-n", "4", "--k", "2,4", "data.eval_size=4", "--out", str(tmp_path / "no-1"))
    rows = [line.split()[0] for line in out.splitlines()]
    assert code == 0 and "maj@2" in rows and "maj@4" in rows and "maj@1" not in rows  # without k=1 too


def test_a_score_of_answers_cut_short_says_so(tiny_model_path, tmp_path):
    """One new token cuts every sum's answer short: the figure measures the limit, and a line says so."""
    code, out = run_eval("tiny", "data.eval_size=6", "--max-new-tokens", "1", "--out", str(tmp_path))
    assert code == 0
    assert "warning: tiny: 100% of the greedy completions were cut off at 1 new tokens" in out
    code, out = run_eval("tiny", "data.eval_size=6", "--out", str(tmp_path / "whole"))
    assert code == 0 and "cut off at" not in out
