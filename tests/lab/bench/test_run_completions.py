"""`bench reward --from RUN` on hand-built samples.jsonl files, and `gsm8k_reward` against the hand
labels of real SmolLM2-135M-Instruct completions (tests/data/grading/real_completions.jsonl)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from aioareal.cli import main
from aioareal.errors import UserError
from aioareal.lab.bench.cases import CASE_FILES, REAL_FILE, REPOSITORY_DIR, Case, cases_dir, load_cases, load_real
from aioareal.lab.bench.run_completions import disagreements, read_rows, scores, summary
from aioareal.tasks.gsm8k import gsm8k_reward


def samples(run: Path, rows: list[dict]) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return run


ROWS = [  # a samples.jsonl row as the run log writes it, plus the completion's text and gold answer
    {"step": 1, "group_id": 0, "reward": 1.0, "length": 12, "answer": "18",
     "completion": "She sells 9 eggs at $2, so she makes \\boxed{18} dollars."},
    {"step": 1, "group_id": 0, "reward": 0.0, "length": 9, "answer": "#### 18",
     "completion": "So Janet makes $18 a day.\n\nCheck: 9 + 3 + 4 = 16 eggs."},  # the last number is a check's
    {"step": 1, "group_id": 1, "reward": 0.0, "length": 7, "answer": "120",
     "completion": "The answer is one hundred twenty."},
]


def test_from_run_grades_a_runs_completions_and_prints_disagreements(capsys, tmp_path: Path) -> None:
    run = samples(tmp_path / "run", ROWS)
    assert main(["bench", "reward", "--from", str(run)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(lines[-1])
    assert figures["rows"] == 3 and figures["pass_ours"] == 1.0 and "agree_ours" not in figures
    assert figures["differ_flexible_regex"] == 2  # reads 16 in the check and no number in words
    shown = "\n".join(lines[:-1])
    assert f"{run / 'samples.jsonl'}:2: gold '18': ours=1" in shown and "flexible_regex=0" in shown


def test_labelled_rows_report_false_passes_and_fails(tmp_path: Path) -> None:
    rows = [{**ROWS[1], "label": 1},
            {"answer": "16", "completion": "She makes $18.\nCheck: 9 + 3 + 4 = 16", "label": 0}]
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    read = read_rows(path)
    graded = scores(read)
    figures = summary(read, graded)
    assert figures["agree_ours"] == 1.0 and figures["false_pass_ours"] == 0 and figures["false_fail_ours"] == 0
    assert figures["false_pass_flexible_regex"] == 1 and figures["false_fail_flexible_regex"] == 1
    assert len(disagreements(read, graded)) == 2


@pytest.mark.parametrize("line, message", [
    ({"step": 1, "reward": 0.0, "length": 12}, "no text field 'completion'"),
    ({"step": 1, "completion": "\\boxed{18}"}, "no text field 'answer'"),
    ({"completion": "\\boxed{18}", "answer": "18", "label": 2}, "'label' must be 1"),
])
def test_rows_without_text_fail_with_the_file_and_line(tmp_path: Path, line: dict, message: str) -> None:
    run = samples(tmp_path / "run", [ROWS[0], line])
    with pytest.raises(UserError, match=rf"samples\.jsonl:2: {message}"):
        read_rows(run)


def test_from_run_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_rows(tmp_path / "nowhere")
    (tmp_path / "bad.jsonl").write_text('{"completion": "x", "answer": "1"}\nnot json\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.jsonl:2: malformed JSON line"):
        read_rows(tmp_path / "bad.jsonl")
    assert main(["bench", "reward", "--from", str(tmp_path / "nowhere")]) == 2
    rows = read_rows(samples(tmp_path / "named", [{"text": "\\boxed{7}", "gold": "7"}]), "text", "gold")
    assert rows[0]["completion"] == "\\boxed{7}" and rows[0]["answer"] == "7"


def test_real_completions_are_labelled_and_graded_as_labelled() -> None:
    rows = load_real(REPOSITORY_DIR)
    assert len(rows) == 280 and len(load_real(REPOSITORY_DIR, "dev")) == 160  # every row of the file, each a test
    assert {r["source"] for r in rows} == {"gsm8k", "sums"}
    assert {r["decoding"] for r in rows} == {"greedy", "sample"} and len({r["id"] for r in rows}) == len(rows)
    got = gsm8k_reward([r["completion"] for r in rows], [r["answer"] for r in rows], timeout_s=20.0)
    wrong = [r["id"] for r, g in zip(rows, got) if g != r["label"]]
    assert wrong == KNOWN_DISAGREEMENTS


KNOWN_DISAGREEMENTS: list[str] = []  # held-out rows the grader misjudges (README, Rewards): none yet


def test_bench_reward_reads_grading_cases_from_a_folder(tmp_path: Path) -> None:
    import shutil

    for name in (*CASE_FILES, REAL_FILE):
        shutil.copy(REPOSITORY_DIR / name, tmp_path / name)
    assert cases_dir(str(tmp_path)) == tmp_path and cases_dir(None) == REPOSITORY_DIR
    assert load_cases(tmp_path) == load_cases(REPOSITORY_DIR) and len(load_real(tmp_path)) == 280
    (tmp_path / REAL_FILE).unlink()
    with pytest.raises(UserError, match=re.escape(f"--cases {tmp_path}: expected a folder with {REAL_FILE}")):
        cases_dir(str(tmp_path))
    assert main(["bench", "reward", "--cases", str(tmp_path / "nowhere")]) == 2


@pytest.mark.parametrize("line, message", [
    ('{"class": "boxed", "gold": "18", "completion": "\\\\boxed{18}", "score": 0.5}', "'score' must be 1.0"),
    ('{"class": "boxed", "gold": 18, "completion": "\\\\boxed{18}", "score": 1.0}', "expected a text field 'gold'"),
    ('{"class": "boxed", "gold": "18", "score": 1.0}', "expected a text field 'completion'"),
    ('{"class": "boxed", "gold": "18", "completion": "18", "score": true}', "'score' must be 1.0"),
    ('["boxed", "18", "18", 1.0]', r"malformed JSON line \(expected a JSON object, got list\)"),
    ('{"class": "boxed", "gold": "18",', "malformed JSON line"),
])
def test_a_bad_case_names_its_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    good = '{"class": "boxed", "gold": "18", "completion": "\\\\boxed{18}", "score": 1.0}'
    (tmp_path / CASE_FILES[0]).write_text(f"{good}\n{line}\n", encoding="utf-8")
    (tmp_path / CASE_FILES[1]).write_text(good + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"{CASE_FILES[0]}:2: {message}"):
        load_cases(tmp_path)
    (tmp_path / CASE_FILES[0]).write_text(good + "\n", encoding="utf-8")
    assert load_cases(tmp_path) == [Case("boxed", "18", "\\boxed{18}", 1.0)] * 2
