"""Reference answers are bounded (docs/reliability.md#the-grader, issue 49): a reference of megabytes
is never read at length, and each reference is read once however many completions are graded against
it, its failure included. Counted work (the lengths handed to the readers, how often they run), not
time."""
from __future__ import annotations

import pytest

from aioareal.grading import verify
from aioareal.grading.verify import MAX_REFERENCE_CHARS, ReferenceTooLong, grade, grade_now
from aioareal.group import Example
from aioareal.tasks.custom import CustomTask

HUGE = {  # bare references of megabytes, each once read whole for every graded completion
    "prose": "word 12 " * 250_000,
    "macros": "\\text{" * 300_000,
    "an equation": "x = " * 500_000,
    "digits": "1" * 2_000_000,
}


@pytest.fixture
def reads(monkeypatch) -> list[int]:
    """The length of every text the grader reads a reference's answer from (verify.read_span)."""
    seen: list[int] = []
    real = verify.read_span
    monkeypatch.setattr(verify, "read_span", lambda text: (seen.append(len(text)), real(text))[1])
    verify._gold.cache_clear()
    return seen


@pytest.mark.parametrize("case", sorted(HUGE))
def test_a_huge_bare_reference_is_a_failure_never_read(case, reads):
    for _ in range(8):  # a group's completions
        with pytest.raises(ReferenceTooLong, match=r"a reference answer of [0-9,]+ characters \(at most 8,192"):
            grade(HUGE[case], "The answer is 12.")
    assert reads == []
    assert grade_now([HUGE[case]], ["The answer is 12."]) == [0.0]  # the standalone form counts it, scores 0


def test_a_reference_is_read_once_for_all_its_completions_even_when_it_fails(reads):
    too_long = "9" * 5_000  # fits MAX_REFERENCE_CHARS but is past Python's integer digit limit
    for _ in range(8):
        with pytest.raises(ValueError):
            grade(too_long, "The answer is 9.")
        assert grade("18", f"The answer is {18}.") == 1.0
    assert sorted(reads) == [2, 5_000]


def test_long_references_with_a_final_answer_still_grade(reads):
    solution = "Some working. " * 150_000 + "#### 18"  # 2 MB of working, then GSM8K's marker
    assert grade(solution, "So she makes \\boxed{18}.") == 1.0
    assert grade(" " * 1_000_000 + "18" + " " * 1_000_000, "The answer is 18.") == 1.0  # padding is not length
    assert max(reads) <= MAX_REFERENCE_CHARS


def test_a_custom_tasks_reference_is_read_once_and_never_at_length(monkeypatch):
    seen: list[int] = []
    real = verify.normalize_number
    monkeypatch.setattr(verify, "normalize_number", lambda text: (seen.append(len(text)), real(text))[1])
    verify.reference_number.cache_clear()
    task = CustomTask.__new__(CustomTask)
    task.timeout_s = 5.0
    for answer in ("42", "word " * 400_000):
        for _ in range(8):
            task.grade("The answer is 42.", Example("q", "?", answer))
    assert seen == [2]  # the short one once; the megabyte one not at all (it is compared as text)
