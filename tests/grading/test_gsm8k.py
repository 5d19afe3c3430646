"""GSM8K task: answer extraction, verification (fast path, math-verify, thread-safe timeout), loading."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gsm8k_data import FULL_TEST_ITEMS, SLICE, GSM8KTest

from aioareal.errors import DataError, UserError
from aioareal.grading import verify as verify_mod
from aioareal.grading.final_answer import extract_answer, normalize_number
from aioareal.grading.verify import math_equal, verify_failures
from aioareal.group import Example
from aioareal.isolation.pool import shared_pool
from aioareal.tasks.base import Task
from aioareal.tasks.gsm8k import INSTRUCTION, GSM8KTask


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def as_example(row: dict) -> Example:
    return Example(uid="x", prompt=row["question"], answer=row["answer"], row=row)


def qa(i: int) -> dict:
    return {"question": f"What is {i} + 1?", "answer": f"{i} + 1 = <<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}"}


# --- extraction and normalisation -------------------------------------------------------------

@pytest.mark.parametrize("text, answer", [
    ("So she makes 18 dollars.\n#### 18", "18"),
    ("#### 42", "42"),
    ("\\boxed{42}", "42"),
    ("first \\boxed{1}, then \\boxed{2}", "2"),
    ("\\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
    ("\\boxed{\\text{{a}}{b}}", "\\text{{a}}{b}"),  # nested braces
    ("\\boxed{7} and #### 8", "7"),  # \boxed beats ####
    ("The answer is 42.", "42"),
    ("so the final answer is $18 per day. Done", "$18"),
    ("**Answer:** -3", "-3"),
    ("The answer is 5 because 2+3=5.", "5"),
    ("The answer is 2 \\cdot 9.", "2 \\cdot 9"),
    ("x = 10-3 = 7 then it dropped to -5", "-5"),
    ("10-3", "3"),
    ("costs $1,234 in total", "1,234"),
    ("no numbers here", None),
    # A sentence where an answer should be: look inside it, else fall back to the last number.
    ("answer: first add 3 and 4 to get 7. So 7", "7"),
    ("#### The answer is 18", "18"),
    ("#### so she pays 18 dollars", "18"),
    ("#### The answer is the sum of 3 and 4 which is 7", "7"),
    ("The answer is the total of 18 apples. I checked 3 times.", "18"),
    ("It drops to \u22125 degrees", "-5"),  # unicode minus in the last-number fallback
    ("The answer is 7 apples.", "7"),
])
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


@pytest.mark.parametrize("raw, number", [
    ("42", "42"), ("$1,234", "1234"), ("1,234.00", "1234"), ("12.50", "12.5"), ("7.0", "7"),
    ("-5", "-5"), ("-0.50", "-0.5"), ("3/4", "3/4"), ("\\frac{3}{4}", "3/4"), ("\\dfrac{1}{2}", "1/2"),
    ("50%", "50"), ("18 dollars", "18"), ("18.", "18"), ("\\$18", "18"), ("1{,}234", "1234"),
    ("5 \\text{ eggs}", "5"), ("\u22124", "-4"),
    ("x + 1", None), ("2 \\cdot 9", None), ("1/0", None), ("", None), ("12,34", None),
    ("5x", None), ("2xy", None), ("3pi", None), ("5 x", "5"), ("5cm", "5"), ("5m", "5"), ("12 m.", "12"),
])
def test_normalize_number(raw: str, number: str | None) -> None:
    assert normalize_number(raw) == number


# --- verification ------------------------------------------------------------------------------

def test_the_slice_holds_the_items_the_tests_name() -> None:
    """tests/data/gsm8k (make_slice.py): 100 test and 100 train items of the MIT-licensed set, the
    first test item first, and test items 611 and 796, whose large answers catch a relative tolerance."""
    rows = {split: [json.loads(line) for line in (SLICE / f"{split}.jsonl").read_text().splitlines()]
            for split in ("test", "train")}
    assert len(rows["test"]) == len(rows["train"]) == 100
    assert rows["test"][0]["question"].startswith("Janet\u2019s ducks lay 16 eggs per day")
    finals = [r["answer"].rpartition("####")[2].strip() for r in rows["test"]]
    assert {"1,450,000", "2880000"} <= set(finals)
    assert "MIT License" in (SLICE / "LICENSE").read_text()


def test_every_gold_solution_scores_itself(gsm8k_test: GSM8KTest) -> None:
    assert len(gsm8k_test.rows) == (FULL_TEST_ITEMS if gsm8k_test.full else 100)
    task = GSM8KTask(path=str(gsm8k_test.path))
    failed = [i for i, r in enumerate(gsm8k_test.rows)
              if task.score(r["answer"], as_example(r)) != 1.0]
    assert failed == []


def test_perturbed_answers_score_zero(gsm8k_test: GSM8KTest) -> None:
    wrong = []
    for i, r in enumerate(gsm8k_test.rows):
        n = int(normalize_number(extract_answer(r["answer"])))
        for completion in (f"The answer is \\boxed{{{n + 1}}}.", f"... so\n#### {n + 1}"):
            if math_equal(r["answer"], completion) != 0.0:
                wrong.append((i, completion))
    assert wrong == []  # items 611 and 796 (1,450,000 and 2,880,000) catch a relative tolerance


@pytest.mark.parametrize("gold, completion, score", [
    ("#### 18", "She makes \\boxed{18} dollars.", 1.0),
    ("#### 1,450,000", "\\boxed{1450000}", 1.0),
    ("#### 1,450,000", "\\boxed{1450001}", 0.0),
    ("#### 18", "\\boxed{18.00}", 1.0),
    ("#### 18", "\\boxed{\\$18}", 1.0),
    ("#### 18", "\\boxed{19}", 0.0),
    ("#### 5", "\\boxed{5x}", 0.0),
    ("#### 18", "I cannot tell.", 0.0),
    ("\\frac{1}{3}", "\\boxed{0.333333}", 1.0),
    ("0.75", "\\boxed{\\frac{3}{4}}", 1.0),
    ("#### 18", "\\boxed{2 \\cdot 9}", 1.0),  # math-verify path
    ("#### 18", "\\boxed{\\sqrt{324}}", 1.0),
    ("#### 18", "\\boxed{\\sqrt{325}}", 0.0),
    ("x + 1", "\\boxed{1 + x}", 1.0),
])
def test_math_equal(gold: str, completion: str, score: float) -> None:
    assert math_equal(gold, completion) == score


def test_math_equal_from_worker_threads() -> None:
    cases = [("#### 18", "\\boxed{2 \\cdot 9}", 1.0), ("#### 18", "\\boxed{\\sqrt{324}}", 1.0),
             ("#### 18", "\\boxed{3 \\cdot 7}", 0.0), ("#### 5", "#### 5", 1.0)] * 4
    before = verify_failures()
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda c: math_equal(c[0], c[1], 10.0), cases))
    assert scores == [c[2] for c in cases]
    assert verify_failures() == before  # no "signal only works in main thread" errors


def warm_pool() -> None:
    """The process-wide worker pool started, with sympy imported, so start-up is not timed."""
    shared_pool(preload=(verify_mod.SYMBOLIC_PRELOAD,)).wait_ready()
    assert math_equal("#### 18", "\\boxed{2 \\cdot 9}") == 1.0


def test_hanging_verification_times_out() -> None:
    warm_pool()
    before = verify_failures()
    with ThreadPoolExecutor(1) as pool:  # from a non-main thread, where signal.alarm cannot work
        # sympy evaluating 9^(9^9) holds the GIL for good: only killing its process stops it, so
        # an answer at all is the timeout at work (the result's own timeout is a hang guard)
        score = pool.submit(math_equal, "#### 18", "\\boxed{9^{9^{9}}}", 0.3).result(timeout=120)
    assert score == 0.0
    assert verify_failures() == before + 1
    assert math_equal("#### 18", "\\boxed{3 \\cdot 6}", 10.0) == 1.0  # the killed worker was replaced


def test_verification_error_scores_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    # A symbolic check that raises inside the worker (str / str: TypeError) scores 0 and is counted.
    monkeypatch.setattr(verify_mod, "SYMBOLIC", "operator:truediv")
    before = verify_failures()
    assert math_equal("#### 18", "\\boxed{2 \\cdot 9}") == 0.0
    assert verify_failures() == before + 1


def test_without_math_verify_falls_back_to_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_mod, "_load_math_verify", lambda: None)
    assert math_equal("x + 1", "\\boxed{x+1}") == 1.0
    assert math_equal("x + 1", "\\boxed{1 + x}") == 0.0
    assert math_equal("#### 18", "\\boxed{18.0}") == 1.0  # the numeric fast path needs no math-verify


# --- the task: prompts, splits, loading errors -------------------------------------------------

def test_task_splits_real_file(gsm8k_test: GSM8KTest) -> None:
    path, rows = str(gsm8k_test.path), gsm8k_test.rows
    held = 200 if gsm8k_test.full else 20
    task = GSM8KTask(path=path, eval_size=held, seed=7)
    assert isinstance(task, Task) and task.name == "gsm8k" and task.chat
    train, held_out = task.splits()
    assert (len(train), len(held_out)) == (len(rows) - held, held)
    assert not {e.uid for e in train} & {e.uid for e in held_out}
    assert [e.uid for e in held_out] == [e.uid for e in GSM8KTask(path=path, eval_size=held, seed=7).splits()[1]]
    assert [e.uid for e in held_out] != [e.uid for e in GSM8KTask(path=path, eval_size=held, seed=8).splits()[1]]
    first = next(e for e in train + held_out if e.uid == "gsm8k-train-0")  # the file's first row
    assert first.prompt == rows[0]["question"] + "\n" + INSTRUCTION
    assert first.prompt.endswith("within \\boxed{}.")
    assert first.answer.endswith("#### 18") and first.row == rows[0]


def test_task_reads_the_train_and_test_files_of_the_slice() -> None:
    train, held_out = GSM8KTask(path=str(SLICE / "train.jsonl"), eval_path=str(SLICE / "test.jsonl"),
                                eval_size=0).splits()
    assert (len(train), len(held_out)) == (100, 100)
    assert all(e.answer.rpartition("####")[2].strip() for e in train + held_out)


def test_task_eval_path_and_truncation(tmp_path: Path) -> None:
    train_file = write_jsonl(tmp_path / "train.jsonl", [qa(i) for i in range(10)])
    eval_file = write_jsonl(tmp_path / "eval.jsonl", [qa(i) for i in range(100, 105)])
    train, held_out = GSM8KTask(path=str(train_file), eval_path=str(eval_file), eval_size=3).splits()
    assert len(train) == 10 and [e.row["question"] for e in held_out] == [qa(i)["question"] for i in (100, 101, 102)]
    for size in (0, 50):  # 0 or more than available: the whole eval file
        assert len(GSM8KTask(path=str(train_file), eval_path=str(eval_file), eval_size=size).splits()[1]) == 5
    assert GSM8KTask(path=str(train_file), eval_size=0).splits()[1] == []  # carving 0 holds out nothing
    with pytest.raises(UserError, match="eval_size=10 would leave no training rows"):
        GSM8KTask(path=str(train_file), eval_size=10).splits()


@pytest.mark.parametrize("suffix", [".json", ".csv", ".parquet"])
def test_task_other_formats(tmp_path: Path, suffix: str) -> None:
    import pandas as pd

    rows = [qa(i) for i in range(6)]
    path = tmp_path / f"data{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        pd.DataFrame(rows).to_parquet(path)
    task = GSM8KTask(path=str(path), eval_size=2)
    train, held_out = task.splits()
    assert len(train) == 4 and len(held_out) == 2
    assert all(task.score(e.answer, e) == 1.0 for e in train + held_out)


def test_malformed_jsonl_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(qa(0)) + "\n\n" + '{"question": "oops",\n' + json.dumps(qa(1)) + "\n")
    with pytest.raises(DataError) as err:
        GSM8KTask(path=str(path), eval_size=0).splits()
    assert f"{path}:3" in str(err.value) and "\n" not in str(err.value)
    task = GSM8KTask(path=str(path), eval_size=0, skip_bad_rows=True)
    assert len(task.splits()[0]) == 2 and task.skipped == 1


def test_missing_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [qa(0), {"question": "no answer here", "solution": "4"}, qa(2)])
    with pytest.raises(DataError) as err:
        GSM8KTask(path=str(path), eval_size=0).splits()
    assert str(err.value) == f"{path}:2: missing field 'answer' (fields: question, solution)"
    task = GSM8KTask(path=str(path), eval_size=0, skip_bad_rows=True)
    train, _ = task.splits()
    assert [e.row["question"] for e in train] == [qa(0)["question"], qa(2)["question"]] and task.skipped == 1
    custom = write_jsonl(tmp_path / "c.jsonl", [{"problem": "1+1?", "solution": "2"}] * 3)
    train, _ = GSM8KTask(path=str(custom), eval_size=1, question_field="problem", answer_field="solution").splits()
    assert len(train) == 2 and train[0].answer == "2"


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"^{tmp_path / 'nope.jsonl'}: no such file; expected a data file"):
        GSM8KTask(path=str(tmp_path / "nope.jsonl")).splits()
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(DataError, match=f"^{tmp_path / 'folder.jsonl'}: a directory; expected a data file"):
        GSM8KTask(path=str(tmp_path / "folder.jsonl")).splits()
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="empty file"):
        GSM8KTask(path=str(tmp_path / "empty.jsonl")).splits()
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match="unsupported file type"):
        GSM8KTask(path=str(tmp_path / "x.txt")).splits()


def test_hub_loading_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def fake_load(name: str, config: str, split: str) -> list[dict]:
        calls.append((name, config, split))
        return [qa(i) for i in range(8 if split == "train" else 4)]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    train, held_out = GSM8KTask(eval_size=3).splits()
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert (len(train), len(held_out)) == (8, 3)

    def offline(*args, **kwargs):
        raise ConnectionError("no route to host\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError) as err:
        GSM8KTask(hub_name="someone/gsm8k-copy").splits()
    message = str(err.value)
    assert "someone/gsm8k-copy" in message and "data.path" in message and "\n" not in message
