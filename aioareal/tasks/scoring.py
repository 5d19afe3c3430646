"""Scorers: the batch form of a task's verdict that the reward service takes.

A scorer is called as `scorer(texts, examples)` with the decoded completions of one group and
their examples, and returns one entry per completion: a number; an `isolation.pool.Deferred` check
whose result is that completion's number (work that may run unbounded, done in a worker process);
or an Exception (that completion's check failed: scored 0 and counted). It may instead return one
`Deferred` whose result is the whole list. A scorer with a `worker_preload` attribute defers work:
the service starts its worker processes (importing those modules) before the first call.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..group import Example

BatchScorer = Callable[[list[str], list[Example]], Sequence[Any]]


def per_item(score: Callable[[str, Example], Any]) -> BatchScorer:
    """Adapt a one-completion `score` to the batch form; one completion's failure is its own."""
    def batch(texts: list[str], examples: list[Example]) -> list[Any]:
        out: list[Any] = []
        for text, example in zip(texts, examples):
            try:
                out.append(score(text, example))
            except Exception as e:  # counted by the reward service; the group's other completions stand
                out.append(e)
        return out
    return batch


class GradedScorer:
    """A task whose `grade(completion, example)` returns a number or a Deferred symbolic check."""

    def __init__(self, grade: Callable[[str, Example], Any], preload: tuple[str, ...]) -> None:
        self.batch, self.worker_preload = per_item(grade), preload

    def __call__(self, texts: list[str], examples: list[Example]) -> list[Any]:
        return self.batch(texts, examples)
