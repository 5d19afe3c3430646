"""Math answer equivalence: a numeric fast path, then math-verify under a thread-safe timeout.

Both sides are reduced to their final answer first (`answers.extract_answer`): math-verify run on a
whole GSM8K gold solution misreads 4 of the 1,319 test items (DESIGN, reference facts). When both
answers are plain numbers they are compared as exact fractions to 6 decimal places (1/3 = 0.333333),
and math-verify is never called; GSM8K golds are always plain numbers, so that is the common case.

math-verify's own timeouts use `signal.alarm`, which only works in the main thread, and rewards
are scored in executor threads. So its timeouts are disabled and each call runs in a daemon thread
that the caller waits on for `timeout_s`. Deviation from a ThreadPoolExecutor: a hung sympy call
cannot be killed, and a pool's worker threads are joined at interpreter exit, so one runaway
expression would hang shutdown; a daemon thread is abandoned instead. At most `MAX_IN_FLIGHT`
calls may be running (hung ones included) before further calls fail fast.
"""
from __future__ import annotations

import threading
from fractions import Fraction
from typing import Any, Callable

from .answers import extract_answer, normalize_number

MAX_IN_FLIGHT = 64
# Agree to 6 decimal places (math-verify's float_rounding=6). Absolute, not relative: a relative 1e-6
# would accept 1450001 for GSM8K's 1,450,000 (test item 611).
TOLERANCE = 1e-6

_lock = threading.Lock()
_failures = 0
_in_flight = 0


def verify_failures() -> int:
    """How many math-verify calls timed out or raised since import (thread-safe)."""
    with _lock:
        return _failures


def math_equal(gold: str, predicted_text: str, timeout_s: float = 5.0) -> float:
    """1.0 if the final answer of `predicted_text` equals the gold answer, else 0.0. Thread-safe.

    `gold` is a bare answer ("18", "\\frac{3}{4}") or a solution ending in `#### N` / `\\boxed{N}`.
    """
    gold_answer = _gold_answer(gold)
    predicted = extract_answer(predicted_text)
    if not gold_answer or not predicted:
        return 0.0
    g, p = normalize_number(gold_answer), normalize_number(predicted)
    if g is not None and p is not None:
        return float(_numbers_equal(g, p))
    math_verify = _load_math_verify()
    if math_verify is None:  # not installed: the best we can do is compare normalised strings
        return float((g or _squash(gold_answer)) == (p or _squash(predicted)))
    try:
        return float(_call_with_timeout(_run_math_verify, (gold_answer, predicted), timeout_s))
    except Exception:  # timeout, or any error inside sympy/math-verify: no reward, but counted
        _count_failure()
        return 0.0


def _gold_answer(gold: str) -> str | None:
    if "####" in gold or "\\boxed" in gold:
        return extract_answer(gold)
    return gold.strip()


def _numbers_equal(a: str, b: str) -> bool:
    x, y = Fraction(a), Fraction(b)
    return abs(x - y) <= TOLERANCE


def _squash(s: str) -> str:
    return "".join(s.split()).strip("$").rstrip(".")


def _load_math_verify() -> Any:
    """Import outside the timed call: the first import (sympy) can take longer than a timeout."""
    try:
        import math_verify
    except ImportError:
        return None
    return math_verify


def _run_math_verify(gold_answer: str, predicted: str) -> bool:
    """The symbolic comparison; signal-based timeouts off (see the module docstring)."""
    from math_verify import parse, verify

    # Wrapping in \boxed{} makes math-verify's LaTeX extractor take the whole answer.
    g = parse(f"\\boxed{{{gold_answer}}}", parsing_timeout=None)
    p = parse(f"\\boxed{{{predicted}}}", parsing_timeout=None)
    return bool(g) and bool(p) and verify(g, p, timeout_seconds=None)


def _call_with_timeout(fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
    """Run fn(*args) in a daemon thread; TimeoutError if it has not returned within timeout_s."""
    global _in_flight
    with _lock:
        if _in_flight >= MAX_IN_FLIGHT:
            raise RuntimeError(f"{_in_flight} math-verify calls still running (hung?)")
        _in_flight += 1
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        global _in_flight
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e
        finally:
            with _lock:
                _in_flight -= 1
            done.set()

    try:
        threading.Thread(target=target, name="math-verify", daemon=True).start()
    except BaseException:  # could not start a thread: undo the reservation
        with _lock:
            _in_flight -= 1
        raise
    if not done.wait(timeout_s):
        raise TimeoutError(f"math-verify took longer than {timeout_s}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _count_failure() -> None:
    global _failures
    with _lock:
        _failures += 1
