"""The GSM8K grader against a careful human grader: 273 written cases (tests/data/grading), the
reading of numbers piece by piece, the public TRL-style reward, and extraction that stays linear in
the length of the completion."""
from __future__ import annotations

import time
from fractions import Fraction

import pytest
from gsm8k_data import GSM8KTest

from aioareal.grading.final_answer import find_answer
from aioareal.grading.numbers import NumberTooLong, read_span
from aioareal.grading.verify import grade, grade_batch, grade_now
from aioareal.isolation.pool import Deferred
from aioareal.lab.bench.cases import REPOSITORY_DIR, load_cases
from aioareal.tasks.gsm8k import gsm8k_reward

CASES = load_cases(REPOSITORY_DIR)

@pytest.mark.parametrize("kind, gold, completion, expected", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_grades_like_a_careful_grader(kind: str, gold: str, completion: str, expected: float) -> None:
    assert grade_now([gold], [completion], timeout_s=20.0) == [expected]


def test_cases_cover_every_class() -> None:
    counts: dict[str, int] = {}
    for kind, *_ in CASES:
        counts[kind] = counts.get(kind, 0) + 1
    assert len(CASES) == 276 and all(n >= 3 for n in counts.values()), counts  # 227 + 49 final-answer cases
    assert {"thousands", "scale", "mixed", "units", "modifiers", "signs", "decimals", "fractions"} <= set(counts)


@pytest.mark.parametrize("span, value", [
    ("1,080", 1080), ("1{,}080", 1080), ("1 080", 1080), ("1\\ 080", 1080), ("1\\,080", 1080),
    ("1\u00a0080", 1080), ("1\u2009080", 1080), ("1.45 million", 1_450_000), ("18 thousand", 18_000),
    ("1.2e3", 1200), ("1.45 \\times 10^6", 1_450_000), ("2\\frac{1}{2}", Fraction(5, 2)),
    ("2 \\frac{1}{2}", Fraction(5, 2)), ("1 1/2", Fraction(3, 2)), ("$18", 18), ("18 dollars", 18), ("18yd", 18),
    ("18 m^2", 18), ("18 ft²", 18), ("18\\text{ cm}", 18), ("18%", 18), ("18 hundred", 1800),
    ("18 and a half", Fraction(37, 2)), ("\u221218", -18), ("-$18", -18), ("18.00", 18), ("\\frac{36}{2}", 18),
    ("x = 18", 18), ("3 \\times 6 = 18", 18), ("eighteen", 18), ("twenty-five dollars", 25), ("2^{10}", 1024),
])
def test_reads_numbers(span: str, value: Fraction | int) -> None:
    assert read_span(span).value == value


@pytest.mark.parametrize("span", ["18 or more", "18 or 19", "18-20", "18 to 20", "at least 18", "≥ 18", "18+",
                                  "16, 17, 18", "18 dollars or 19 dollars", "18 \\pm 1", "\\text{up to } 18"])
def test_hedges_are_no_answer(span: str) -> None:
    assert read_span(span).hedged


@pytest.mark.parametrize("span", ["2 \\cdot 9", "\\sqrt{324}", "18 - 2", "5x", "9^{9^{9}}", "10^{10^{7}}"])
def test_formulas_go_to_the_symbolic_check(span: str) -> None:
    reading = read_span(span)
    assert reading.symbolic and reading.value is None
    assert isinstance(grade("18", f"\\boxed{{{span}}}"), Deferred)


def test_answer_sources() -> None:
    assert find_answer("x \\boxed{18} then #### 19").source == "boxed"
    assert find_answer("#### Step 2: Revenue\n#### 18").text == "18"
    assert find_answer("The answer is not 16; so she makes 18").source == "last"
    found = find_answer("\\boxed{18} and later \\boxed{19}")
    assert found.text == "19" and not found.void and found.reading.value == 19  # the final box
    assert find_answer("\\boxed{18} or \\boxed{19}").reading.hedged
    assert not find_answer("\\boxed{18} or \\boxed{18.0}").reading.hedged
    assert find_answer("\\boxed{18}. The final answer is \\boxed{}").void
    assert find_answer("\\boxed{18}. Wait, I forgot 2. The answer is 20.").source == "phrase"
    assert find_answer("\\boxed{\\boxed{18}}").text == "18"  # nested: the innermost box


def test_gsm8k_like_completions_of_every_test_item_grade_right(gsm8k_test: GSM8KTest) -> None:
    """`bench reward`'s completions (eight closing styles) for every test item (the slice's 100, or
    all 1,319), right and wrong."""
    from aioareal.lab.bench.reward import completions

    rows = gsm8k_test.rows if len(gsm8k_test.rows) % 2 else gsm8k_test.rows + gsm8k_test.rows[:1]
    golds, texts = completions(rows, 2 * len(rows))  # an odd count of rows: each item both right and wrong
    assert grade_batch(golds, texts) == [1.0 if i % 2 == 0 else 0.0 for i in range(len(texts))]


def test_gsm8k_reward_is_a_trl_reward_function() -> None:
    solutions = ["She makes 9 * 2 = <<9*2=18>>18 dollars.\n#### 18"] * 3 + ["18"]
    completions = ["... so she makes \\boxed{18}.", "The answer is 19.", "#### 18", "\\boxed{\\$18.00}"]
    assert gsm8k_reward(completions, solutions, prompts=["q"] * 4) == [1.0, 0.0, 1.0, 1.0]
    conversational = [[{"role": "assistant", "content": "The answer is $\\boxed{18}$."}]]
    assert gsm8k_reward(completions=conversational, answer=["#### 18"]) == [1.0]


def test_numbers_past_the_digit_limit_raise_instead_of_comparing() -> None:
    with pytest.raises(NumberTooLong):
        grade("18", "\\boxed{" + "9" * 5000 + "}")
    with pytest.raises(NumberTooLong):
        grade("18", "The answer is 1e99999.")
    assert gsm8k_reward(["\\boxed{" + "9" * 5000 + "}"], ["18"]) == [0.0]  # standalone: 0, counted


PATHOLOGICAL = {
    "unclosed boxes": lambda n: "\\boxed{" * (n // 7),
    "nested braces": lambda n: "\\boxed{" + "{" * (n // 2) + "18" + "}" * (n // 2) + "}",
    "nested boxes": lambda n: "\\boxed{" * (n // 7) + "18" + "}" * (n // 7),
    "many boxes": lambda n: "\\boxed{1}" * (n // 9),
    "digit groups": lambda n: "1" + " 000" * (n // 4),
    "spaces": lambda n: "a" + " " * n + "1",
    "hashes": lambda n: "#" * n,
    "phrases": lambda n: "the answer is not 16; " * (n // 22),
    "numbers": lambda n: "1 2 " * (n // 4),
    "fractions": lambda n: "\\frac{1}{2}" * (n // 11),
    "minus signs": lambda n: "-" * n + "1",
    "asides": lambda n: "It is 1. " + "(1). " * (n // 5),
    "unmatched parens": lambda n: "It is 1. " + ")" * n,
    "trailers": lambda n: "So she makes 1. " + "Check: 1 + 1 = 2. " * (n // 18),
    "words that keep a trailer": lambda n: "1 so " * (n // 5),
    "number words": lambda n: "So it is " + "one hundred twenty " * (n // 19),
    "words after a numeral": lambda n: "1 " + "twenty " * (n // 7),
    "retractions": lambda n: "\\boxed{1} " + "wait " * (n // 5),
    "boxes offered together": lambda n: "\\boxed{1} or " * (n // 13),
    "paired units": lambda n: "It takes " + "1 hour 2 minutes " * (n // 17),
    "sign words": lambda n: "minus " * (n // 6) + "3",
    "equations": lambda n: "\\boxed{" + "1 = " * (n // 4) + "2}",
    "phrases in two spellings": lambda n: "Answer is not 1. answer is not 2. " * (n // 34),
    "list items": lambda n: "1. a\n" * (n // 5),
    "cut off": lambda n: "It is 1 " + "and then " * (n // 9),
}


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_extraction_is_linear_in_the_length(name: str) -> None:
    """Four times the text may take about four times as long (was quadratic: 56k chars of unclosed
    boxes took 42 s). A ratio of this thread's CPU time, never an absolute bound
    (docs/architecture.md#layers: tests time nothing on the wall clock)."""
    def seconds(n: int) -> float:  # CPU time of this thread: other jobs on a busy machine do not count
        text = PATHOLOGICAL[name](n)
        start = time.thread_time()
        try:
            grade("18", text)
        except NumberTooLong:
            pass
        return time.thread_time() - start

    small, large = min(seconds(25_000) for _ in range(2)), min(seconds(100_000) for _ in range(2))
    assert large < 12 * small + 0.05  # linear with slack for a loaded machine; quadratic would be ~16x
