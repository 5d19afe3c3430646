"""Graders other RL stacks ship, for `bench reward` to measure agreement against (not used in training).

- strict regex: the first `#### N` (`#### (\\-?[0-9\\.\\,]+)`, as in lm-eval-harness's GSM8K
  "strict-match" and verl's `gsm8k.py` default), commas, `$` and a final `.` dropped, compared as a
  string with the gold's `#### N`;
- flexible regex: the last number-like run in the text (lm-eval's "flexible-extract",
  `(-?[$0-9.,]{2,})|(-?[0-9]+)`), same normalisation;
- math-verify alone: `verify(parse(gold), parse(completion))` with math-verify's own extraction.
"""
from __future__ import annotations

import re

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")


def gold_number(gold: str) -> str:
    return _normal(gold.split("####")[-1])


def strict_regex(gold: str, completion: str) -> float:
    m = _STRICT.search(completion)
    return float(m is not None and _normal(m.group(1)) == gold_number(gold))


def flexible_regex(gold: str, completion: str) -> float:
    matches = [a or b for a, b in _FLEXIBLE.findall(completion)]
    return float(bool(matches) and _normal(matches[-1]) == gold_number(gold))


def math_verify_alone(gold: str, completion: str) -> float:
    """In the calling process with math-verify's signal timeouts: call from the main thread only."""
    from math_verify import parse, verify

    return float(verify(parse(gold.split("####")[-1].strip()), parse(completion)))


def _normal(s: str) -> str:
    s = s.strip().replace(",", "").replace("$", "")
    return s[:-1] if s.endswith(".") else s


BASELINES = {"strict_regex": strict_regex, "flexible_regex": flexible_regex, "math_verify": math_verify_alone}
