"""The figures of `eval` (aioareal/evaluation/scored_completions.py): pass@k against a brute-force count over
every k-subset, its invariants, maj@k on hand cases, standard errors."""
from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aioareal.evaluation.scored_completions import (
    PromptVerdicts,
    completion_figures,
    ks_up_to,
    maj_at_k,
    majority,
    mean_se,
    pass_at_k,
    sampled_figures,
)

n_c = st.integers(1, 24).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n)))


def brute_pass_at_k(passed: list[bool], k: int) -> float:
    """The fraction of k-subsets of the samples that hold at least one pass."""
    subsets = list(itertools.combinations(passed, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("passed", [[True, False, False, True, False], [False] * 4, [True] * 3,
                                    [False, False, True, False, False, False, True]])
def test_pass_at_k_is_the_fraction_of_k_subsets_with_a_pass(passed):
    for k in range(1, len(passed) + 1):
        assert pass_at_k(len(passed), sum(passed), k) == pytest.approx(brute_pass_at_k(passed, k))


@given(n_c)
def test_pass_at_k_is_monotone_in_k_and_within_0_1(nc):
    n, c = nc
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:]))


@given(n_c)
def test_pass_at_1_is_the_empirical_fraction(nc):
    n, c = nc
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


@given(n_c)
def test_pass_at_n_is_whether_any_passed(nc):
    n, c = nc
    assert pass_at_k(n, c, n) == (1.0 if c else 0.0)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_ks_are_powers_of_two_then_n():
    assert ks_up_to(1) == [1]
    assert ks_up_to(4) == [1, 2, 4]
    assert ks_up_to(6) == [1, 2, 4, 6]
    assert ks_up_to(0) == []


def test_majority_hand_cases():
    assert majority(["3", "4", "3"]) == "3"
    assert majority(["4", "3", "3", "4"]) == "4"  # tie: the answer seen first
    assert majority([None, None, "7"]) == "7"  # no answer does not vote
    assert majority([None, None]) is None


def test_maj_at_k_hand_cases():
    answers = ["5", "6", "6", "5", "5"]
    passed = [True, False, False, True, True]
    assert maj_at_k(answers, passed, 1)  # "5" alone
    assert maj_at_k(answers, passed, 2)  # tie 5/6: the first seen, "5", passes
    assert not maj_at_k(answers, passed, 3)  # "6" twice
    assert maj_at_k(answers, passed, 4)  # 2-2 tie: "5", seen first, wins
    assert maj_at_k(answers, passed, 5)  # "5" three times
    assert not maj_at_k([None, None], [False, False], 2)


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=50))
def test_mean_se_matches_the_textbook_formula(values):
    mean, se = mean_se(values)
    n = len(values)
    m = sum(values) / n
    assert mean == pytest.approx(m)
    assert se == pytest.approx(math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n), abs=1e-6)


def test_mean_se_of_one_value_has_no_standard_error():
    assert mean_se([0.5])[0] == 0.5 and math.isnan(mean_se([0.5])[1])


def test_figures_average_over_prompts():
    prompts = [PromptVerdicts([1.0, 0.0], [True, False], [3, 5], [False, True], ["1", "2"]),
               PromptVerdicts([0.0, 0.0], [False, False], [4, 4], [False, False], [None, "9"])]
    figures = {**completion_figures(prompts), **sampled_figures(prompts)}
    assert figures["pass@1"] == pytest.approx(0.25)
    assert figures["pass@2"] == pytest.approx(0.5)
    assert figures["maj@1"] == pytest.approx(0.5) and figures["maj@2"] == pytest.approx(0.5)
    assert figures["length_mean"] == pytest.approx(4.0) and figures["truncated"] == pytest.approx(0.25)
    assert figures["pass@2_se"] == pytest.approx(0.5)  # values 1 and 0: sd 0.707 / sqrt(2)


def test_no_answers_no_maj():
    prompts = [PromptVerdicts([1.0], [True], [1], [False])]
    assert "maj@1" not in sampled_figures(prompts)


def test_final_answers_for_voting():
    from aioareal.evaluation.scored_completions import answer_reader
    from aioareal.tasks import ArithmeticTask

    raw = answer_reader(ArithmeticTask())
    assert raw(" 68 ") == "68" and raw("  ") is None
    chat = answer_reader(ArithmeticTask(style="chat"))
    assert chat("So 600 + 400 = \\boxed{1,000}.") == "1000"
    assert chat("The answer is $12.50") == "12.5"
    assert chat("I do not know.") is None

    class FileTask:
        name, chat = "file", True

    assert answer_reader(FileTask()) is None  # no answer defined: no maj@k
