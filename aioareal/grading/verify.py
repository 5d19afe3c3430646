"""Math answer equivalence: a numeric fast path in-process, math-verify in a worker process.

Both sides are reduced to their final answer first (math-verify on a whole gold solution misreads
some: docs/architecture.md#reference-facts). `grade` decides in-process when both read as numbers
(exact fractions to 6 decimal places, absolute: a relative 1e-6 would accept 1450001 for GSM8K's
1,450,000) or the completion has no single answer; a formula or a symbolic gold comes back as a
`Deferred` check for the reward service's worker pool. `math_equal` and `grade_now` are the
standalone forms, with the process-wide pool and failures counted in `verify_failures()`.

A reference answer is read once (`_gold` is cached, failures included) and never at length: a
solution from its last `MAX_CHARS`, a bare answer refused past MAX_REFERENCE_CHARS
(`ReferenceTooLong`, a counted failure), since a huge one costs CPU with the GIL held per completion.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import threading
from fractions import Fraction
from typing import Any

from ..isolation.pool import Deferred, shared_pool
from .final_answer import MAX_CHARS, find_answer, normalize_number
from .numbers import Reading, read_span

# A reward worker imports math-verify (sympy: seconds) before its first job, not during one.
SYMBOLIC_PRELOAD = "math_verify"
SYMBOLIC = f"{__name__}:equivalent"  # the job a deferred check runs in a worker
TOLERANCE = Fraction(1, 10**6)  # agree to 6 decimal places (math-verify's float_rounding=6)
MAX_REFERENCE_CHARS = MAX_CHARS  # a bare reference answer longer than what is read of a completion is not one

_lock = threading.Lock()
_failures = 0

# "Timeout is disabled ..." on every call: the worker pool is the timeout.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def equivalent(gold: str, predicted: str) -> float:
    """1.0 when math-verify finds the two answers equal, else 0.0. Run only in a reward worker
    process (`isolation/pool.py`): sympy may run without bound while holding the GIL, and the pool
    kills a worker on timeout. math-verify's own timeouts (`signal.alarm`) are off for that reason."""
    from math_verify import parse, verify  # here, not at the top: the trainer's process never loads sympy

    # Wrapping in \boxed{} makes math-verify's LaTeX extractor take the whole answer.
    g = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    p = parse(f"\\boxed{{{predicted}}}", parsing_timeout=None)
    return float(bool(g) and bool(p) and verify(g, p, timeout_seconds=None))


def verify_failures() -> int:
    """How many standalone checks timed out or failed since import (thread-safe)."""
    with _lock:
        return _failures


def grade(gold: str, completion: str) -> float | Deferred:
    """1.0 / 0.0 when decided by reading numbers, else a Deferred symbolic check. `gold` is a bare
    answer or a solution ending in `#### N` / `\\boxed{N}`. Raises ValueError (numbers.NumberTooLong)
    past Python's integer digit limit, `ReferenceTooLong` for a bare `gold` past MAX_REFERENCE_CHARS.
    """
    gold_text, g, failure = _gold(gold)
    if failure is not None:
        raise type(failure)(*failure.args)  # a fresh one: the cached one would gather every raise's frames
    found = find_answer(completion)
    if not gold_text or found is None or found.void or found.reading.hedged:
        return 0.0
    p = found.reading
    if g.value is not None and p.value is not None:
        return float(numbers_equal(g, p))
    if g.value is not None and not p.symbolic:
        return 0.0
    return Deferred(SYMBOLIC, (gold_text, found.text))


class ReferenceTooLong(ValueError):
    """A bare reference answer past MAX_REFERENCE_CHARS: graded as a failure, never read."""


@functools.lru_cache(maxsize=4096)  # a group's G completions share one gold, read once, failures too
def _gold(gold: str) -> tuple[str | None, Reading, ValueError | None]:
    """The gold's answer text, its reading, and why it cannot be graded (None when it can)."""
    try:
        text = gold_answer(gold)
        return text, read_span(text) if text else Reading(), None
    except ValueError as e:  # NumberTooLong, ReferenceTooLong: every completion against it fails alike
        return None, Reading(), e


def gold_answer(gold: str) -> str | None:
    """The answer a reference states: its final `####`/`\\boxed` answer (read from its end, as a
    completion's), or the whole of a bare answer, refused past MAX_REFERENCE_CHARS."""
    if "####" in gold or "\\boxed" in gold:
        found = find_answer(gold)
        return found.text if found is not None else None
    text = gold.strip()
    if len(text) > MAX_REFERENCE_CHARS:
        raise ReferenceTooLong(f"a reference answer of {len(text):,} characters (at most {MAX_REFERENCE_CHARS:,} "
                               "without a #### or \\boxed final answer)")
    return text or None


@functools.lru_cache(maxsize=4096)
def reference_number(answer: str) -> str | None:
    """`normalize_number(answer)` for a reference, cached; none past MAX_REFERENCE_CHARS (not read)."""
    return normalize_number(answer) if len(answer) <= MAX_REFERENCE_CHARS else None


def numbers_equal(gold: Reading, predicted: Reading) -> bool:
    """Equal to 6 decimal places; an answer written with % also matches its value / 100, and one in
    paired units ("3 hours 20 minutes") matches its value in any of them (10/3 or 200)."""
    assert gold.value is not None and predicted.value is not None
    if gold.value == predicted.value or abs(gold.value - predicted.value) <= TOLERANCE:  # runs per completion
        return True
    others = (*predicted.also, *((predicted.value / 100,) if predicted.percent else ()))
    return any(abs(gold.value - v) <= TOLERANCE for v in others)


def math_equal(gold: str, predicted_text: str, timeout_s: float = 5.0) -> float:
    """1.0 if the final answer of `predicted_text` equals the gold answer, else 0.0. Thread-safe."""
    return grade_now([gold], [predicted_text], timeout_s)[0]


def grade_now(golds: list[str], completions: list[str], timeout_s: float = 5.0) -> list[float]:
    """`grade` for a batch, with the deferred checks run (concurrently) in the process-wide pool."""
    results: list[Any] = []
    for gold, completion in zip(golds, completions):
        try:
            results.append(grade(gold, completion))
        except ValueError:  # a number past the digit limit: no reward, but counted
            _count_failure()
            results.append(0.0)
    deferred = [i for i, r in enumerate(results) if isinstance(r, Deferred)]
    if deferred and _load_math_verify() is None:  # not installed: compare what is written
        for i in deferred:
            results[i] = float(_squash(results[i].args[0]) == _squash(results[i].args[1]))
    elif deferred:
        pool = shared_pool(preload=(SYMBOLIC_PRELOAD,))
        futures = {i: pool.submit(results[i].fn, results[i].args, timeout_s) for i in deferred}
        for i, future in futures.items():
            outcome = future.result()
            results[i] = float(outcome.value) if outcome.ok else _count_failure()
    return [float(r) for r in results]


def grade_batch(golds: list[str], completions: list[str]) -> list[float | Deferred | None]:
    """`grade` for a batch, nothing deferred run (`bench reward`'s workers); None past the digit limit."""
    out: list[float | Deferred | None] = []
    for gold, completion in zip(golds, completions):
        try:
            out.append(grade(gold, completion))
        except ValueError:
            out.append(None)
    return out


def _squash(s: str) -> str:
    return "".join(s.split()).strip("$").rstrip(".")


def _load_math_verify() -> Any:
    """math-verify's import spec, or None when it is not installed (checked without importing sympy here)."""
    return importlib.util.find_spec("math_verify")


def _count_failure() -> float:
    global _failures
    with _lock:
        _failures += 1
    return 0.0
