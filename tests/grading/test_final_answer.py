"""Issue 28's pieces one at a time: number words, paired units, trailers, boxes, and the rule for
which answer is final, with property tests for their invariants. The cases a careful grader scored
are in tests/data/grading (`tests/grading/test_grading.py`)."""
from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal.grading.final_answer import find_answer, scan
from aioareal.grading.number_words import last_words, read_words
from aioareal.grading.numbers import read_last, read_quantity, read_span
from aioareal.grading.trailers import is_trailer, strip_trailers
from aioareal.grading.verify import grade

PROPS = settings(deadline=None, max_examples=60, derandomize=True)
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
         "seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def spelled(n: int, hyphen: bool = True, and_: bool = False) -> str:
    """n in English words, as a test-side reference (not the parser's tables)."""
    if n < 20:
        return _UNITS[n]
    if n < 100:
        return _TENS[n // 10] + (("-" if hyphen else " ") + _UNITS[n % 10] if n % 10 else "")
    if n < 1000:
        rest = n % 100
        return _UNITS[n // 100] + " hundred" + ((" and " if and_ else " ") + spelled(rest, hyphen) if rest else "")
    for size, name in ((10**9, "billion"), (10**6, "million"), (1000, "thousand")):
        if n >= size:
            rest = n % size
            return spelled(n // size, hyphen, and_) + f" {name}" + (" " + spelled(rest, hyphen, and_) if rest else "")
    raise AssertionError(n)


@PROPS
@given(st.integers(0, 10**12 - 1), st.booleans(), st.booleans())
def test_number_words_read_back_every_integer(n: int, hyphen: bool, and_: bool) -> None:
    words = spelled(n, hyphen, and_)
    assert read_words(words) == (n, len(words))
    assert read_span(f"The answer is {words}.").value == n
    assert read_span(f"\\text{{negative {words}}}").value == -n


@pytest.mark.parametrize("text, value", [
    ("twelve hundred", 1200), ("twenty-five hundred", 2500), ("a hundred", 100), ("a thousand and five", 1005),
    ("seventeen and a half", Fraction(35, 2)), ("three quarters", Fraction(3, 4)), ("two thirds", Fraction(2, 3)),
    ("a half", Fraction(1, 2)), ("one million two hundred thousand", 1_200_000),
])
def test_number_words(text: str, value: int | Fraction) -> None:
    assert read_words(text) == (value, len(text))


@pytest.mark.parametrize("text, end", [("two three", 3), ("five six hundred", 4), ("thousand", None), ("a", None),
                                       ("twenty twelve", 6), ("two thousand three thousand", 18)])
def test_number_words_stop_where_the_number_does(text: str, end: int | None) -> None:
    read = read_words(text)
    assert (read[1] if read else None) == end


def test_a_lone_one_in_prose_is_a_pronoun() -> None:
    assert last_words("each one costs two dollars") == (2, 15, 18)
    assert last_words("so the one on the left") is None
    assert read_last("She sells each one for $2, so she makes 18 dollars in one day.").value == 18


@PROPS
@given(st.integers(1, 99), st.integers(1, 59))
def test_hours_and_minutes_match_in_either_unit(hours: int, minutes: int) -> None:
    reading = read_span(f"{hours} hours and {minutes} minutes")
    assert {reading.value, *reading.also} == {hours + Fraction(minutes, 60), 60 * hours + minutes}
    assert grade(str(60 * hours + minutes), f"The trip takes {hours} hours {minutes} minutes.") == 1.0
    assert grade(str(minutes), f"The trip takes {hours} hours {minutes} minutes.") == 0.0


@pytest.mark.parametrize("rest, currency, values", [
    (" dollars and 50 cents", "", (Fraction(37, 2), 1850)), (" and 50 cents", "$", (Fraction(37, 2), 1850)),
    (" ft 6 in", "", (Fraction(11, 2), 66)),
    (" hour, 20 minutes and 30 seconds", "", (Fraction(161, 120), Fraction(161, 2), 4830)),
    (" kg 250 g", "", (Fraction(9, 4), 2250)),
])
def test_paired_units(rest: str, currency: str, values: tuple) -> None:
    first = 18 if "dollars" in rest or currency else (5 if "ft" in rest else (1 if "hour" in rest else 2))
    quantity = read_quantity(rest, currency)
    assert quantity is not None and quantity.values(Fraction(first)) == tuple(Fraction(v) for v in values)
    assert quantity.end == len(rest) and read_quantity("18" + rest, currency, 2).end == len(rest) + 2


@pytest.mark.parametrize("rest", [" minutes 3 hours", " apples and 5 oranges", " dollars in 5 days", " cents",
                                  " hours 20 dollars"])
def test_units_that_do_not_pair(rest: str) -> None:
    assert read_quantity(rest) is None


@PROPS
@given(st.integers(1, 10**6 - 1), st.integers(1, 6))
def test_leading_dot_decimals(digits: int, width: int) -> None:
    text = str(digits).zfill(width)
    value = Fraction(int(text), 10 ** len(text))
    assert read_span(f".{text}").value == value
    assert grade(str(value.numerator / value.denominator), f"\\boxed{{.{text}}}") == 1.0


@pytest.mark.parametrize("text, kept", [
    ("She makes $18.\nCheck: 9 + 3 + 4 = 16.", "She makes $18.\n"),
    ("She makes $18. (She keeps 7 of 16 eggs.)", "She makes $18. "),
    ("She makes $18.\n(Note: 16 eggs a day.)\nHope this helps!", "She makes $18.\n"),
    ("She makes $20.\nCheck: 9 × 2 = 18, not 20. So she makes $18.", None),
    ("Check: 16 - 3 - 4 = 9 eggs, so she makes 18 dollars.", None),  # a check before any statement
    ("She earns $18 (9 eggs × $2).", None),  # an aside inside the sentence
])
def test_strip_trailers(text: str, kept: str | None) -> None:
    assert strip_trailers(text) == (text if kept is None else kept)


@PROPS
@given(st.integers(0, 999), st.lists(st.integers(0, 999), min_size=1, max_size=4),
       st.sampled_from(["Check: {}.", "**Verification:** {} ✓", "Note: {}.", "(That is {}.)",
                        "Let me know if {} helps!"]))
def test_a_trailer_never_changes_the_final_statement(answer: int, numbers: list[int], trailer: str) -> None:
    body = f"She sells 9 eggs, so she makes {answer} dollars a day."
    sums = " + ".join(map(str, numbers)) + f" = {sum(numbers)}"
    assert find_answer(f"{body}\n\n{trailer.format(sums)}").reading.value == answer


@PROPS
@given(st.lists(st.integers(0, 999), min_size=1, max_size=5), st.integers(0, 999))
def test_the_final_box_wins_over_corrected_ones(earlier: list[int], final: int) -> None:
    text = "".join(f"First I get \\boxed{{{n}}}, but that is wrong. " for n in earlier) + f"So \\boxed{{{final}}}."
    assert grade(str(final), text) == 1.0
    assert all(grade(str(n), text) == 0.0 for n in earlier if n != final)


@PROPS
@given(st.integers(0, 999), st.integers(0, 999), st.sampled_from([" or ", ", ", " and ", " or maybe "]))
def test_boxes_offered_as_alternatives_are_no_answer(a: int, b: int, joint: str) -> None:
    text = f"The answer is \\boxed{{{a}}}{joint}\\boxed{{{b}}}."
    assert (find_answer(text).reading.hedged) == (a != b)


def test_scan_finds_the_final_box_closed_or_not() -> None:
    leaves, final = scan("\\boxed{\\boxed{18}} then \\boxed{2")
    assert [leaf.text("\\boxed{\\boxed{18}} then \\boxed{2") for leaf in leaves] == ["18"] and final.close is None
    assert scan("no box")[1] is None


@pytest.mark.parametrize("text, value", [
    ("\\boxed{18}. Wait, let me double-check: 9 × 2 = 18 and 9 + 3 + 4 = 16. Correct.", 18),
    ("\\boxed{24}. Oops, I forgot the 2 she gives away, so 26 in all.", 26),
    ("\\boxed{24}. I hope this is not wrong.", 24),  # a retraction word without a new answer
    ("#### 20\nWait, she also bakes 4: so she makes 18.", 18),
    ("The answer is 20. Hmm, let me recalculate: 9 × 2 = 18.", 18),
])
def test_later_commitments(text: str, value: int) -> None:
    assert find_answer(text).reading.value == value


def test_trailer_detection() -> None:
    assert is_trailer("Wait, let me double-check: 9 × 2 = 18 ✓")
    assert not is_trailer("Wait, let me double-check: 9 × 2 = 18, not 20, so the answer is 18.")


# Issue 35, item 10: an alternative the completion names after its answer only to reject it is not the answer.
REJECTIONS = ("So she has 12 apples, not 15.", "She makes $12, not $15.", "The total is 12 and not 15.",
              "Therefore 12 apples, not 15 as I first thought.", "12 apples rather than 15.",
              "She has 12 left, as opposed to 15.", "That gives 12 — not 15.", "So 3 + 9 = 12, not 15.",
              "So she earns 12 dollars, NOT 15.", "So she pays 12 dollars. Not 15.", "She keeps 12 (not 15).",
              "The answer is 12, not 15.", "The answer is 12 rather than 15.", "The answer is 12. It is not 15.",
              "So it is 12 instead of 15.", "\\boxed{12}, not 15", "#### 12, not 15",
              "The answer is 15. Wait, I miscalculated: it is 12, not 15.")


@pytest.mark.parametrize("completion", REJECTIONS)
def test_a_rejected_alternative_is_not_the_answer(completion: str) -> None:
    assert (grade("12", completion), grade("15", completion)) == (1.0, 0.0)


@pytest.mark.parametrize("completion", ("It is not 15 but 12.", "Not 15, but 12.",
                                        "She had 15, not 3. Now she has 12."))
def test_an_answer_after_a_rejection_stands(completion: str) -> None:
    assert grade("12", completion) == 1.0
