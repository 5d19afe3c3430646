"""The symbolic check, run inside reward worker processes (`isolation/pool.py`), never in the trainer's.

math-verify (sympy) decides answers the numeric fast path cannot (`2 \\cdot 9`, `\\sqrt{324}`,
`x + 1`), but sympy may run without bound (`9^{9^{9}}`) while holding the GIL, so this module is
only imported by workers, which the pool kills on timeout. math-verify's own timeouts are off: they
use `signal.alarm`, and the one timeout that counts is the reward service's.
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
