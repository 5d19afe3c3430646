"""Numbers written in words: "one hundred twenty" is 120, "twelve hundred" 1200, "seventeen and a
half" 17.5, "three quarters" 0.75 (signs are the caller's: `numbers`).

`read_words(t, pos)` parses the longest number phrase at `pos` and says where it ends, by a small state
machine over the words (one regex match per word: linear); `last_words(t)` finds a sentence's last
number phrase, skipping a lone "one" (in prose more often a pronoun: "each one costs $2").
"""
from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                     "fourteen fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_DENOMINATORS = {"half": 2, "halves": 2, "third": 3, "thirds": 3, "quarter": 4, "quarters": 4, "fourth": 4,
                 "fourths": 4}
_FIRST = re.compile(r"[A-Za-z]+")
_NEXT = re.compile(r"(?: |-)(?:and )?([A-Za-z]+)")
_HALF = re.compile(r" and (?:a|one) half(?![A-Za-z])", re.I)
# Where a number phrase may start in prose (a word boundary, then a cardinal or "a hundred").
START = re.compile(r"(?<![A-Za-z])(?:" + "|".join(sorted([*_UNITS, *_TENS], key=len, reverse=True))
                    + r"|a (?=hundred|thousand|million|billion))(?![a-z])", re.I)
# START for scanning a sentence's ASCII-lowercased copy (same indices): without the lookbehind and
# the case-insensitive flag the regex engine skips ahead to the words' first letters; the lookbehind
# is checked on the few matches (`last_words`).
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_SCAN = re.compile("(?:" + "|".join(sorted([*_UNITS, *_TENS], key=len, reverse=True))
                   + r"|a (?=hundred|thousand|million|billion))(?![a-z])")


def read_words(t: str, pos: int = 0) -> tuple[Fraction, int] | None:
    """The number written in words at `t[pos:]` and the index where it ends, or None."""
    cardinal = _cardinal(t, pos)
    if cardinal is None:
        return None
    value, end, words = cardinal
    fraction = _fraction(t, end, value, words)
    if fraction is not None:
        value, end = fraction
    elif (half := _HALF.match(t, end)) is not None:
        value, end = value + Fraction(1, 2), half.end()
    elif words == ["a"]:
        return None  # "a" alone is an article
    return value, end


def last_words(t: str, pos: int = 0, endpos: int | None = None) -> tuple[Fraction, int, int] | None:
    """(value, start, end) of the last number phrase that starts in `t[pos:endpos]`, a lone "one" skipped."""
    found, end, lower = None, 0, t.translate(_LOWER)
    for m in _SCAN.finditer(lower, pos, len(t) if endpos is None else endpos):
        if m.start() < end or (m.start() and "a" <= lower[m.start() - 1] <= "z"):
            continue  # inside the phrase just read ("one hundred twenty": not "twenty" again), or a word
        read = read_words(t, m.start())
        if read is None:
            continue
        end = read[1]
        if t[m.start():end].lower() != "one":
            found = (read[0], m.start(), end)
    return found


def _cardinal(t: str, pos: int) -> tuple[Fraction, int, list[str]] | None:
    """A whole number in words: (value, end, the words read). Scales must fall ("two thousand five hundred")."""
    m = _FIRST.match(t, pos)
    total, group, state, scale_cap, words, end = 0, 0, "start", None, [], pos
    while m is not None:
        word = m.group(m.lastindex or 0).lower()
        step = _step(state, word, group, scale_cap)
        if step is None:
            break
        state, value = step
        if state == "scale":
            total, group, scale_cap = total + max(group, 1) * value, 0, value
        elif state == "hundred":
            group = max(group, 1) * 100
        else:
            group += value
        words.append(word)
        end = m.end()
        m = _NEXT.match(t, end)
    if not words:
        return None
    return Fraction(total + group), end, words


def _step(state: str, word: str, group: int, scale_cap: int | None) -> tuple[str, int] | None:
    """The next state and the word's value, or None when `word` cannot continue the number."""
    if word == "a" and state == "start":
        return "a", 0
    if word == "hundred" and state in ("a", "unit", "teen", "tens") and group < 100:
        return "hundred", 100
    if word in _SCALES and state != "start" and (scale_cap is None or _SCALES[word] < scale_cap):
        return "scale", _SCALES[word]
    if state in ("a", "unit", "teen"):
        return None
    if word in _TENS and state in ("start", "hundred", "scale"):
        return "tens", _TENS[word]
    if word in _UNITS and (state in ("start", "hundred", "scale") or (state == "tens" and _UNITS[word] < 10)):
        return ("unit" if _UNITS[word] < 10 else "teen"), _UNITS[word]
    return None


def _fraction(t: str, end: int, numerator: Fraction, words: list[str]) -> tuple[Fraction, int] | None:
    """"three quarters", "a half", "two thirds": a cardinal of one word, then a denominator."""
    m = _NEXT.match(t, end)
    if m is None or len(words) != 1 or m.group(1).lower() not in _DENOMINATORS or "and " in m.group(0):
        return None
    return max(numerator, Fraction(1)) / _DENOMINATORS[m.group(1).lower()], m.end()
