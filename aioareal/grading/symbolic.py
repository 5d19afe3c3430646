"""The symbolic check (math-verify), imported only by reward worker processes (`isolation/pool.py`):
sympy may run without bound while holding the GIL, and the pool kills workers on timeout.
math-verify's own timeouts (`signal.alarm`) are off: the reward service's is the one that counts.
"""
from __future__ import annotations

import logging

from math_verify import parse, verify

# "Timeout is disabled ..." on every call: the pool is the timeout.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def equivalent(gold: str, predicted: str) -> float:
    """1.0 when math-verify finds the two answers equal, else 0.0."""
    # Wrapping in \boxed{} makes math-verify's LaTeX extractor take the whole answer.
    g = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    p = parse(f"\\boxed{{{predicted}}}", parsing_timeout=None)
    return float(bool(g) and bool(p) and verify(g, p, timeout_seconds=None))
