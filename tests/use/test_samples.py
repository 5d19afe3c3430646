"""What the model wrote: the completion text the reward service decoded, kept (cut) in samples.jsonl
with the prompt's id, shown on the dashboard, printed by `python -m aioareal samples`."""
from __future__ import annotations

import asyncio
import io
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from aioareal.cli import main
from aioareal.group import Completion, Example, Group, Sample
from aioareal.monitor.dashboard import render
from aioareal.monitor.metrics import PROMPT_TEXT_CHARS, LiveState, clip_text, sample_rows
from aioareal.rewards.service import RewardService
from aioareal.use.samples import select

OLD_FIELDS = {"step", "group_id", "version_min", "version_max", "staleness", "reward", "advantage", "length",
              "finish_reason", "admitted_at", "finished_at", "trained_at"}


def test_clip_text_hand_values():
    assert clip_text("abcdef", 3) == "abc…" and clip_text("abc", 3) == "abc"
    assert clip_text("abc", 0) is None and clip_text(None, 10) is None


@settings(deadline=None, max_examples=60, derandomize=True)
@given(text=st.text(max_size=40), limit=st.integers(1, 50))
def test_property_clip_text_keeps_a_prefix_and_marks_the_cut(text, limit):
    out = clip_text(text, limit)
    if len(text) <= limit:
        assert out == text
    else:
        assert out == text[:limit] + "…" and len(out) == limit + 1


def group_with_text(prompt: str = "What is 12+7?", texts=("19", "The answer is 20")) -> Group:
    group = Group(3, [4, 5], len(texts), Example("row-17", prompt, "19"), admitted_at=1.0)
    for i, text in enumerate(texts):
        completion = Completion([10 + i, 11], [-0.5, -0.25], [2, 3], "stop", text=text)
        group.samples.append(Sample([4, 5], completion, reward=float(i == 0), advantage=0.5 - i))
    return group


def test_sample_rows_add_text_prompt_and_its_id_and_nothing_else_changes():
    rows = sample_rows(step=4, trained_version=3, groups=[group_with_text()], now=9.0, text_chars=10)
    assert set(rows[0]) == OLD_FIELDS | {"prompt_id", "prompt", "text"}
    assert [r["text"] for r in rows] == ["19", "The answer…"]
    assert rows[1]["prompt_id"] == "row-17" and rows[1]["prompt"] is None  # 13 characters do not fit in 10
    assert sample_rows(4, 3, [group_with_text()], 9.0, text_chars=100)[0]["prompt"] == "What is 12+7?"
    long_prompt = sample_rows(4, 3, [group_with_text("x" * (PROMPT_TEXT_CHARS + 1))], 9.0, text_chars=10_000)
    assert long_prompt[0]["prompt"] is None and long_prompt[0]["text"] == "19"  # found by prompt_id instead
    off = sample_rows(4, 3, [group_with_text()], 9.0, text_chars=0)
    assert all(r["text"] is None and r["prompt"] is None and r["prompt_id"] == "row-17" for r in off)
    assert {k: v for k, v in off[1].items() if k in OLD_FIELDS} == {
        "step": 4, "group_id": 3, "version_min": 2, "version_max": 3, "staleness": 1, "reward": 0.0,
        "advantage": -0.5, "length": 2, "finish_reason": "stop", "admitted_at": 1.0, "finished_at": 0.0,
        "trained_at": 9.0}


def test_score_group_keeps_the_texts_it_decoded_even_when_the_check_fails():
    decode = lambda ids: "+".join(map(str, ids))  # noqa: E731

    def scorer(texts, examples):
        return [1.0 if t == "10+11" else ValueError("no") for t in texts]

    group = group_with_text(texts=(None, None))
    service = RewardService(scorer, decode, workers=1, timeout_s=5)
    assert asyncio.run(service.score_group(group)) == ([1.0, 0.0], 1)
    assert [c.text for c in group.completions] == ["10+11", "11+11"]

    def broken(texts, examples):
        raise RuntimeError("verifier bug")

    group = group_with_text(texts=(None, None))
    assert asyncio.run(RewardService(broken, decode, workers=1).score_group(group)) == ([0.0, 0.0], 2)
    assert [c.text for c in group.completions] == ["10+11", "11+11"]


def draw(snap, width=100, height=30, header=None) -> str:
    console = Console(record=True, width=width, height=height, force_terminal=True, color_system=None,
                      file=io.StringIO())
    console.print(render(snap, header))
    return console.export_text()


def test_dashboard_shows_the_latest_completion_with_its_reward_and_the_gap():
    live = LiveState("run", "async", 2, "ppo", [torch.device("cpu")], 10)
    row = {"step": 4, "reward_mean": 0.5, "logprob_gap_mean": 0.00125, "logprob_gap_max": 0.0345}
    rows = sample_rows(4, 3, [group_with_text(texts=("19", "I think\n\x1b[2J it is " + "twenty " * 40))], 9.0, 4000)
    live.record(row, [1, 1], rows[-1])
    text = draw(live.refresh(), header=Text("sweep 1/2"))
    assert "latest completion · step 4 · reward 0.000" in text and "logp gap 0.0013 max 0.035" in text
    assert "I think \\x1b[2J it is twenty twenty" in text and "\x1b" not in text  # escapes shown, not run
    assert "prompt What is 12+7?" in text  # what the completion answers, above it
    lines = text.splitlines()
    assert len(lines) <= 30 and max(len(line) for line in lines) <= 100 and lines[-2].endswith("… │")
    live.record({"step": 5, "reward_mean": 0.5}, [0], sample_rows(5, 5, [group_with_text()], 9.0, 0)[-1])
    assert "no text (run.sample_text_chars=0)" in draw(live.refresh())


ROWS = [{"step": 1, "reward": 0.0, "advantage": -1.0, "staleness": 0, "prompt_id": "a", "prompt": "1+1?", "text": "3"},
        {"step": 1, "reward": 1.0, "advantage": 1.0, "staleness": 0, "prompt_id": "a", "prompt": "1+1?", "text": "2"},
        {"step": 2, "reward": 1.0, "advantage": 0.5, "staleness": 1, "prompt_id": "b", "prompt": None,
         "text": "line one\nline two"},
        {"step": 2, "reward": 0.5, "advantage": 0.0, "staleness": 1, "prompt_id": "b", "prompt": None, "text": None}]


def test_select_filters_sorts_and_limits():
    texts = lambda rows: [r["text"] for r in rows]  # noqa: E731
    assert texts(select(ROWS, n=2)) == ["line one\nline two", None]  # the latest, in file order
    assert texts(select(ROWS, order="best", n=2)) == ["line one\nline two", "2"]  # ties: the later step first
    assert texts(select(ROWS, order="worst", n=0)) == ["3", None, "line one\nline two", "2"]
    assert texts(select(ROWS, step=1, order="best")) == ["2", "3"]


def write_run(tmp_path, lines: list[str]):
    run = tmp_path / "run"
    run.mkdir()
    (run / "samples.jsonl").write_text("".join(line + "\n" for line in lines))
    return run


def test_samples_command_prints_the_chosen_completions(tmp_path, capsys):
    run = write_run(tmp_path, [json.dumps(r) for r in ROWS])
    assert main(["samples", str(run), "--best", "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 2 · reward 1.000 · advantage +0.500 · staleness 1 · prompt b\n  line one\n  line two")
    assert "step 1 · reward 1.000 · advantage +1.000 · staleness 0 · prompt a\n  prompt: 1+1?\n  2\n" in out
    assert main(["samples", str(run), "--step", "2", "--worst", "-n", "1"]) == 0
    assert "reward 0.500" in (out := capsys.readouterr().out) and "(no text: run.sample_text_chars=0" in out


@pytest.mark.parametrize("make, args, expected", [
    (None, [], "error: {run}: no such run directory"),
    ([], ["--step", "9"], "error: {run}: no samples trained at step 9 (steps 1, 2)"),
    (['{"step": 1, "reward": 1.0}', '{"step": 2, "rew'], [], "error: {run}/samples.jsonl:2: malformed JSON line"),
    (['{"step": 1, "reward": "high"}'], [], "error: {run}/samples.jsonl:1: 'reward' must be a number, got 'high'"),
])
def test_samples_command_errors_are_one_line(tmp_path, capsys, make, args, expected):
    run = tmp_path / "run" if make is None else write_run(tmp_path, make or [json.dumps(r) for r in ROWS])
    assert main(["samples", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(expected.format(run=run)) and len(err.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    assert main(["samples", str(tmp_path / "empty")]) == 2
    assert "no samples.jsonl" in capsys.readouterr().err


def test_a_step_without_evaluation_names_the_evaluation_steps(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval_samples.jsonl").write_text("".join(json.dumps({"step": step, "reward": 1.0, "text": "2"}) + "\n"
                                                    for step in (0, 10, 20)))
    assert main(["samples", str(run), "--eval", "--step", "7"]) == 2
    assert capsys.readouterr().err == f"error: {run}: no samples evaluated at step 7 (evaluation steps 0, 10, 20)\n"


def test_a_run_writes_the_text_and_the_gap_and_the_command_reads_them(tmp_path, capsys):
    """Sync mode on the CPU: generator and trainer hold the same fp32 weights, every token is fresh."""
    run = tmp_path / "run"
    assert main(["model.name=random:tiny", "--steps", "1", "algo.batch_groups=2", "eval.every=0", "data.eval_size=8",
                 "run.sample_text_chars=5", "--no-dashboard", "--run-dir", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert rows and all(isinstance(r["text"], str) and len(r["text"]) <= 6 and r["prompt_id"] for r in rows)
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0 <= metrics["logprob_gap_mean"] <= metrics["logprob_gap_max"] < 1e-3
    capsys.readouterr()
    assert main(["samples", str(run), "-n", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"step 1 · reward {rows[-1]['reward']:.3f}")
