"""Reading a written answer as a number, the way a careful grader does (docs/rewards.md#reading-the-answer).

An answer is a numeral (`numerals`), a number in words (`number_words`) or a quantity in paired units
(`quantities`). What surrounds it decides whether it is one: before it, decoration is fine, a sign
word negates it and a bound is a hedge; right after it, alternatives, ranges and lists are hedges,
an operator makes it part of a formula (`$18/day` is a rate), anything else is units or prose; an
equation is read at the side it concludes with, unless prose comes before its `=`. A hedge equals
nothing. Every pattern is linear in its input (no unbounded repetition after an optional prefix).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from fractions import Fraction

from .latex import clean
from .number_words import START as WORD_START
from .number_words import last_words, read_words
from .numerals import NUMBER, NumberTooLong, canonical, numeral_value  # noqa: F401 (two re-exported)
from .quantities import read_quantity

_DECORATION = re.compile(r"[\s*(\[:=]*+(?:(?:about|approximately|approx\.?|around|roughly|≈|~) ?)?"
                         r"(?:(?:usd|us\$|rs\.?|inr|eur|gbp|cad|aud) ?)?[\s*(\[]*", re.I)
_BOUND_BEFORE = re.compile(r"(?<![A-Za-z])(?:at (?:least|most)|(?:more|less|fewer|greater|higher|lower) than|"
                           r"up to|over|under|above|below|nearly|almost|between|from|no (?:more|less) than|"
                           r"≥|≤|>|<|±|\+/-) ?[$€£¥₹]?$", re.I)
_ALTERNATIVE_AFTER = re.compile(r" ?(?:%|percent|per ?cent)? ?(?:or|to|through|thru|and|&|–|—|~|,|;) ?[$€£¥₹]? ?[-.]?\d"
                                r"|-\d| ?(?:or|and) (?:more|less|fewer|so|above|below|greater|higher|lower|over|under|"
                                r"up|maybe|possibly|perhaps)(?![a-z])| ?(?:±|\+/-|\+-)|\+(?! ?[\d(])", re.I)
# "/" before a unit is a rate ("$18/day", "18 / hour"), not a division.
_OPERATOR_AFTER = re.compile(r" ?(?:[-+×*÷^·<>]|/(?! ?(?:[A-Za-z]{2,}|[hdsm](?![A-Za-z])))|x ?[\d(]|\\)"
                             r"|(?:[xyz]+|pi)(?![A-Za-z])| (?:minus|plus|times|divided by|multiplied by) ?[$]?\d")
_SIGN_WORD = re.compile(r"(?:negative|minus) ?", re.I)
_SIGN_BEFORE = re.compile(r"(?:(?<![\d)] )(?<![\d)])minus|negative) ?$", re.I)  # "20 minus 3" is a difference
_WORD_ALTERNATIVE = re.compile(r" ?(?:or|to|-|–) ?(?:" + WORD_START.pattern + ")", re.I)  # "eighteen or nineteen"
_REGION = re.compile(r"[^,;:(\d]*")  # units and words up to the first separator or digit
_BOUND_IN_REGION = re.compile(r"\b(?:or|to) (?:more|less|fewer|so)\b|\bat (?:least|most)\b"
                              r"|\bor (?:maybe|possibly)\b", re.I)
_JOINS_NEXT = re.compile(r"\b(?:or|to|and) ?[$€£¥₹]? ?$", re.I)  # "18 dollars or " + a digit
_PERCENT_AFTER = re.compile(r" ?(?:%|percent\b|per cent\b)", re.I)
_LIST_GAP = re.compile(r" ?(?:%|percent)? ?(?:,|;|/|&|or|and|to|–|—|, ?and|, ?or)? ?", re.I)
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_INCOMPLETE = re.compile(r" ?[=+×*/÷-] ?$")
# Right before a number: the sentence names it as the alternative it rejects ("12, not 15", "12 (and not
# 15)", "12 rather than 15", "12 - not 15"); searched only in the `_REJECT_WINDOW` characters before it.
_REJECTED = re.compile(r"(?:[\s,;:(—–-]|\b(?:and|but)\b)*+(?:\bnot|\bnever|\brather than|\binstead of|"
                       r"\bas opposed to) ?(?:[$€£¥₹] ?)?$", re.I)
_REJECT_WINDOW = 24
_REJECTING = re.compile(r"\b(?:not|never|rather than|instead of|as opposed to)\b", re.I)

@dataclass(frozen=True)
class Reading:
    value: Fraction | None = None  # the number the text commits to
    hedged: bool = False  # alternatives, a range, a bound or a list: no single answer
    symbolic: bool = False  # not a plain number (a formula): for a symbolic checker
    percent: bool = False  # written with %: also read as value / 100
    slash: bool = False  # written as a fraction (kept as a/b by normalize_number)
    text: str = ""  # the part that was read, as written (cleaned)
    also: tuple[Fraction, ...] = ()  # the same quantity in its other units ("3 hours 20 minutes": 200)


HEDGE = Reading(hedged=True)
NOTHING = Reading()
_FORMULA = Reading(symbolic=True)


def read_span(span: str) -> Reading:
    """A whole answer (box contents, a `####` line, an answer phrase): a number, a hedge, a formula,
    or, for a sentence, the last number in it."""
    t = trim(clean(span))
    if not t:
        return NOTHING
    reading = leading(t)
    if "=" in t or "≈" in t:
        sign = max(t.rfind("="), t.rfind("≈"))
        if reading is None or reading.symbolic or not _PROSE_WORD.search(t, 0, sign):
            rhs = trim(t[sign + 1:])  # "x = 18", "3 × 6 = 18", "\\frac{4}{20} = 20\\%"
            reading = (leading(rhs) if rhs else None) or reading
    if reading is not None and not reading.symbolic:
        return reading
    if reading is None and len(_PROSE_WORD.findall(t)) >= 2:
        return read_last(t)  # a sentence: "so 12 in all"
    if _REJECTING.search(t):
        rejected = read_last(t)  # "12 - not 15": a rejected alternative, not a formula
        if rejected.value is not None:
            return rejected
    return Reading(symbolic=True, text=t) if re.search(r"[\w\\]", t) else NOTHING


def trim(t: str) -> str:
    """`t` without the punctuation around an answer; a leading dot stays before a digit (".5")."""
    t = t.rstrip(" .,;:!*")
    start = len(t) - len(t.lstrip(" .,;:!*"))
    if start and t[start - 1] == "." and t[start:start + 1].isdigit():
        start -= 1
    return t[start:]


def leading(t: str) -> Reading | None:
    """The number `t` starts with, if the rest leaves it an answer; a hedge; or None (not one number)."""
    sign = _SIGN_WORD.match(t)
    reading = _unsigned(t[sign.end():] if sign else t)
    return _negated(reading) if sign and reading is not None else reading


def read_last(sentence: str) -> Reading:
    """The last number of a sentence, unless it is hedged, one of a list, or ends in `=`. A last number
    the sentence rejects ("12 apples, not 15") is passed over for the one before (two passes at most)."""
    t = clean(sentence)
    plain = re.sub(r"\([^()]*\)", " ", t)  # "so she makes 18 dollars (9 × 2)": the 18
    if plain != t and (NUMBER.search(plain) or last_words(plain)):
        t = plain
    reading, start = _last(t)
    rejection = _REJECTED.search(t, max(0, start - _REJECT_WINDOW), start) if start > 0 else None
    if rejection is not None:
        before, _ = _last(t[:rejection.start()])
        if before != NOTHING:
            return before
    return reading


def _last(t: str) -> tuple[Reading, int]:
    """The reading of the last number of cleaned `t`, and where that number starts (-1: none)."""
    recent: list[re.Match[str]] = []  # the last three numerals: a quantity has at most three parts here
    for m in NUMBER.finditer(t):
        recent = [*recent[-2:], m]
    words = last_words(t, recent[-1].end() if recent else 0)  # only words after the last numeral count
    if words is not None:
        return _last_words(t, *words), words[1]
    return (_last_numeral(t, recent), recent[-1].start()) if recent else (NOTHING, -1)


def _unsigned(t: str) -> Reading | None:
    m = NUMBER.search(t)
    if m is None or not _DECORATION.fullmatch(t, 0, m.start()):
        if m is not None and _BOUND_BEFORE.search(t, 0, m.start()):
            return HEDGE
        return _leading_words(t)
    return _judge(m, t[m.end():], m.group(0).strip())


def _leading_words(t: str) -> Reading | None:
    """"eighteen", "one hundred twenty", "three quarters" at the start of an answer."""
    read = read_words(t)
    if read is None:
        return None
    rest = t[read[1]:]
    if re.search(r"\d", rest) or _OPERATOR_AFTER.match(rest):  # "three times 6 = 18": not the three
        return None
    verdict = _verdict(rest)
    if verdict is not None:
        return verdict
    return Reading(value=read[0], percent=bool(_PERCENT_AFTER.match(rest)), text=t[:read[1]])


def _last_numeral(t: str, recent: list[re.Match[str]]) -> Reading:
    last = recent[-1]
    for first in recent[:-1]:  # "3 hours 20 minutes": one quantity that ends with the last numeral
        quantity = read_quantity(t, _currency(first), first.end())
        if quantity is not None and quantity.end >= last.end():
            last = first
            break
    rest, text = t[last.end():], (last["sign"] or "") + last["num"]
    previous = recent[recent.index(last) - 1] if recent.index(last) else None
    if _BOUND_BEFORE.search(t, max(0, last.start() - 40), last.start()) or (
            previous is not None and _LIST_GAP.fullmatch(t, previous.end(), last.start())):
        return Reading(hedged=True, text=text)
    if _INCOMPLETE.fullmatch(rest):  # a truncated "9 × 2 =": no answer yet
        return NOTHING
    reading = _judge(last, rest, text)
    if reading.hedged:
        return Reading(hedged=True, text=text)
    return NOTHING if reading.symbolic else _signed(t, last.start(), reading)  # "... is 5x": no plain number


def _last_words(t: str, value: Fraction, start: int, end: int) -> Reading:
    rest, text = t[end:], t[start:end]
    if _BOUND_BEFORE.search(t, max(0, start - 40), start):
        return Reading(hedged=True, text=text)
    verdict = _verdict(rest)
    if verdict is not None:
        return Reading(hedged=True, text=text) if verdict.hedged else NOTHING
    return _signed(t, start, Reading(value=value, percent=bool(_PERCENT_AFTER.match(rest)), text=text))


def _judge(m: re.Match[str], rest: str, text: str) -> Reading:
    """A numeral followed by `rest`: a quantity, a hedge, part of a formula, or the answer (with units or prose)."""
    quantity = read_quantity(rest, _currency(m)) if rest else None  # a bare number (most boxes): no units
    value = numeral_value(m) if quantity is not None else None
    if quantity is not None and value is not None:
        values = quantity.values(value)
        return Reading(value=values[0], also=values[1:], text=text + rest[:quantity.end])
    verdict = _verdict(rest)
    if verdict is not None:
        return replace(verdict, text=text) if verdict.symbolic else verdict
    value = numeral_value(m)
    if value is None:
        return Reading(symbolic=True, text=text)
    return Reading(value=value, percent=bool(_PERCENT_AFTER.match(rest)), slash=bool(m["den"]), text=text)


def _verdict(rest: str) -> Reading | None:
    """What follows a number makes it a hedge (HEDGE), part of a formula (_FORMULA), or neither (None)."""
    if not rest:
        return None
    if _ALTERNATIVE_AFTER.match(rest) or _WORD_ALTERNATIVE.match(rest):
        return HEDGE
    if _OPERATOR_AFTER.match(rest):
        return _FORMULA
    region = _REGION.match(rest)
    words = region.group(0) if region else ""
    if _BOUND_IN_REGION.search(words) or (rest[len(words):][:1].isdigit() and _JOINS_NEXT.search(words)):
        return HEDGE  # "18 dollars or more", "18 apples and 5 oranges"
    return None


def _currency(m: re.Match[str]) -> str:
    before = m.group(0)[:m.start("num") - m.start()]
    return next((c for c in before if c in "$€£¥₹"), "")


def _signed(t: str, start: int, reading: Reading) -> Reading:
    """"negative 3", "minus three" in a sentence; not "20 minus 3" (a difference)."""
    if reading.value is None or not _SIGN_BEFORE.search(t, max(0, start - 12), start):
        return reading
    return _negated(reading)


def _negated(reading: Reading) -> Reading:
    if reading.value is None:
        return reading
    return replace(reading, value=-reading.value, also=tuple(-a for a in reading.also), text="-" + reading.text)
