"""The arithmetic task's question style (tasks/arithmetic.py): 'Question: What is 23 plus 45?\\nAnswer:'
as raw text for a base model, graded by the last number on the completion's first line, so an
answer the model goes on writing after ("\\nQuestion: ...") is still read right; held-out prompts
never seen in training; maj@k reads the same answer."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aioareal.evaluation.scored_completions import answer_reader
from aioareal.tasks.arithmetic import ArithmeticTask, line_answer


def test_prompts_are_questions_and_the_splits_are_disjoint():
    task = ArithmeticTask(digits=2, ops="+-*%", eval_size=50, style="question")
    train, held_out = task.splits()
    assert not task.chat and {e.uid for e in train}.isdisjoint(e.uid for e in held_out)
    example = next(e for e in held_out if e.row["op"] == "-")
    assert example.prompt == f"Question: What is {example.row['a']} minus {example.row['b']}?\nAnswer:"
    assert {e.prompt.split()[4] for e in train} == {"plus", "minus", "times", "modulo"}


def test_the_answer_is_the_last_number_of_the_first_line():
    task = ArithmeticTask(style="question")
    example = next(e for e in task.splits()[1] if e.row["op"] == "+")
    a, b, answer = example.row["a"], example.row["b"], example.answer
    assert task.score(f" {a} + {b} = {answer}\nQuestion: What is 3 plus 4?\nAnswer: 7", example) == 1.0
    assert task.score(f" {answer}", example) == 1.0
    assert task.score(f"\n\n {answer}.\n", example) == 1.0  # the first line with text
    assert task.score(f" {a} + {b} =\n{answer}", example) == 0.0  # the answer line ends without one
    assert task.score(" I do not know", example) == 0.0
    assert answer_reader(task)(f" {a} + {b} = {answer}") == answer


@given(st.integers(-10**6, 10**6), st.text(alphabet=" +=abc?.", max_size=12))
def test_line_answer_reads_integers_with_their_sign(n, before):
    assert line_answer(f"{before.replace('-', '')} = {n}\nQuestion: 12") == str(n)
    assert line_answer(f"{n:04d}") == str(n)  # leading zeros: the same number


def test_a_line_of_digits_is_no_answer_past_forty_digits():
    assert line_answer("7" * 40) == "7" * 40 and line_answer("7" * 41) is None and line_answer("") is None
