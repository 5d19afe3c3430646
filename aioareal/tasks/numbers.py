"""Reading a written answer as a number, the way a careful grader does.

`NUMBER` recognises one written quantity in cleaned text (`latex.clean`): a sign, a currency symbol,
a numeral with thousands separators (`1,080`, `1 080`) and decimals, then at most one of a mixed
fraction (`2 1/2`), a fraction (`36/2`), scientific notation (`1.2e3`, `1.45 × 10^6`) or a power
(`2^10`), then a scale (`1.45 million`, `18k`) and `and a half`. What surrounds the number decides
whether it is an answer:

- before it, decoration is fine (`$`, `about`, `USD`) but a bound is a hedge (`at least 18`, `≥ 18`);
- right after it, alternatives, ranges and lists are hedges (`18 or 19`, `18-20`, `18, 19`,
  `18 or more`, `18+`), an operator makes it part of a formula (`18 - 2`, `5x`), anything else is
  units or prose (`18 m^2`, `18 dollars per day`, `18 because ...`).

A hedge is never equal to anything. Numbers longer than Python's integer digit limit raise
`NumberTooLong` (a ValueError) instead of being compared: the reward service counts it as an error.
Every pattern is linear in its input (no unbounded repetition after an optional prefix).
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from fractions import Fraction

from .latex import clean

MAX_DIGITS = getattr(sys, "get_int_max_str_digits", lambda: 4300)() or 4300

_NUMERAL = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d{1,3}(?: \d{3})+(?![\d/])|\d+)(?:\.\d+)?|\.\d+"
NUMBER = re.compile(
    r"(?<!\^)(?<!\^ )(?P<sign>(?<![\w)\]}])-)?(?:[$€£¥₹] ?)?(?P<neg>-)?(?P<num>" + _NUMERAL + r")"
    r"(?: (?P<mixed>\d+ ?/ ?\d+)(?![\d/.])| ?/ ?(?P<den>\d+(?:\.\d+)?)(?![\d/]))?"
    r"(?:[eE](?P<exp>[-+]?\d+)(?!\w)| ?[×x*·] ?10 ?\^ ?(?P<exp10>[-+]?\d+)(?![\d^])|\^(?P<pow>\d+)(?![\d^.]))?"
    r"(?: ?(?P<scale>hundred|thousand|million|billion|trillion)s?(?![A-Za-z])|(?P<suffix>k|K|MM|M|bn|B)(?![A-Za-z]))?"
    r"(?P<half> (?:and )?(?:a|one) half(?![A-Za-z]))?")
_SCALES = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12,
           "k": 10**3, "K": 10**3, "M": 10**6, "MM": 10**6, "B": 10**9, "bn": 10**9}
_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                     "fourteen fifteen sixteen seventeen eighteen nineteen".split())}
_WORDS.update({w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)})
_WORD_NUMBER = re.compile(r"(?P<tens>twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)(?:[- ](?P<unit>one|two|"
                          r"three|four|five|six|seven|eight|nine))?(?![a-z])|(?P<small>[a-z]+)(?![a-z])", re.I)

_DECORATION = re.compile(r"[\s*(\[:=]*(?:(?:about|approximately|approx\.?|around|roughly|≈|~) ?)?"
                         r"(?:(?:usd|us\$|rs\.?|inr|eur|gbp|cad|aud) ?)?[\s*(\[]*", re.I)
_BOUND_BEFORE = re.compile(r"(?<![A-Za-z])(?:at (?:least|most)|(?:more|less|fewer|greater|higher|lower) than|"
                           r"up to|over|under|above|below|nearly|almost|between|from|no (?:more|less) than|"
                           r"≥|≤|>|<|±|\+/-) ?[$€£¥₹]?$", re.I)
_ALTERNATIVE_AFTER = re.compile(r" ?(?:%|percent|per ?cent)? ?(?:or|to|through|thru|and|&|–|—|~|,|;) ?[$€£¥₹]? ?[-.]?\d"
                                r"|-\d| ?(?:or|and) (?:more|less|fewer|so|above|below|greater|higher|lower|over|under|"
                                r"up|maybe|possibly|perhaps)(?![a-z])| ?(?:±|\+/-|\+-)|\+(?! ?[\d(])", re.I)
_OPERATOR_AFTER = re.compile(r" ?(?:[-+×*/÷^·<>]|x ?[\d(]|\\)|(?:[xyz]+|pi)(?![A-Za-z])")
_REGION = re.compile(r"[^,;:(\d]*")  # units and words up to the first separator or digit
_BOUND_IN_REGION = re.compile(r"\b(?:or|to) (?:more|less|fewer|so)\b|\bat (?:least|most)\b"
                              r"|\bor (?:maybe|possibly)\b", re.I)
_JOINS_NEXT = re.compile(r"\b(?:or|to|and) ?[$€£¥₹]? ?$", re.I)  # "18 dollars or " + a digit
_PERCENT_AFTER = re.compile(r" ?(?:%|percent\b|per cent\b)", re.I)
_LIST_GAP = re.compile(r" ?(?:%|percent)? ?(?:,|;|/|&|or|and|to|–|—|, ?and|, ?or)? ?", re.I)
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_INCOMPLETE = re.compile(r" ?[=+×*/÷-] ?$")


class NumberTooLong(ValueError):
    """A numeral or exponent past Python's integer digit limit (sys.get_int_max_str_digits)."""


@dataclass(frozen=True)
class Reading:
    value: Fraction | None = None  # the number the text commits to
    hedged: bool = False  # alternatives, a range, a bound or a list: no single answer
    symbolic: bool = False  # not a plain number (a formula): for a symbolic checker
    percent: bool = False  # written with %: also read as value / 100
    slash: bool = False  # written as a fraction (kept as a/b by normalize_number)
    text: str = ""  # the part that was read, as written (cleaned)


HEDGE = Reading(hedged=True)
NOTHING = Reading()


def read_span(span: str) -> Reading:
    """A whole answer (box contents, a `####` line, an answer phrase): a number, a hedge, a formula,
    or, for a sentence, the last number in it."""
    t = clean(span).strip(" .,;:!*")
    if not t:
        return NOTHING
    reading = leading(t)
    if (reading is None or reading.symbolic) and ("=" in t or "≈" in t):
        rhs = re.split(r"[=≈]", t)[-1].strip(" .,;:!*")  # "x = 18", "3 × 6 = 18"
        reading = (leading(rhs) if rhs else None) or reading
    if reading is not None and not reading.symbolic:
        return reading
    if reading is None and len(_PROSE_WORD.findall(t)) >= 2:
        return read_last(t)
    return Reading(symbolic=True, text=t) if re.search(r"[\w\\]", t) else NOTHING


def leading(t: str) -> Reading | None:
    """The number `t` starts with, if the rest leaves it an answer; a hedge; or None (not one number)."""
    m = NUMBER.search(t)
    if m is None or not _DECORATION.fullmatch(t, 0, m.start()):
        if m is not None and _BOUND_BEFORE.search(t, 0, m.start()):
            return HEDGE
        return _word_number(t)
    return _judge(m, t[m.end():], m.group(0).strip())


def read_last(sentence: str) -> Reading:
    """The last number of a sentence, unless it is hedged, one of a list, or ends in `=`."""
    t = clean(sentence)
    plain = re.sub(r"\([^()]*\)", " ", t)  # "so she makes 18 dollars (9 × 2)": the 18
    if plain != t and NUMBER.search(plain):
        t = plain
    last = previous = None
    for m in NUMBER.finditer(t):
        previous, last = last, m
    if last is None:
        return NOTHING
    rest = t[last.end():]
    text = (last["sign"] or "") + last["num"]
    if _BOUND_BEFORE.search(t, max(0, last.start() - 40), last.start()) or (
            previous is not None and _LIST_GAP.fullmatch(t, previous.end(), last.start())):
        return Reading(hedged=True, text=text)
    if _INCOMPLETE.fullmatch(rest):  # a truncated "9 × 2 =": no answer yet
        return NOTHING
    reading = _judge(last, rest, text)
    if reading.hedged:
        return Reading(hedged=True, text=text)
    return NOTHING if reading.symbolic else reading  # "... is 5x": no plain final number


def _judge(m: re.Match[str], rest: str, text: str) -> Reading:
    """A number followed by `rest`: a hedge, part of a formula, or the answer (with units or prose)."""
    if _ALTERNATIVE_AFTER.match(rest):
        return HEDGE
    if _OPERATOR_AFTER.match(rest):
        return Reading(symbolic=True, text=text)
    region = _REGION.match(rest)
    words = region.group(0) if region else ""
    if _BOUND_IN_REGION.search(words) or (rest[len(words):][:1].isdigit() and _JOINS_NEXT.search(words)):
        return HEDGE  # "18 dollars or more", "18 apples and 5 oranges"
    value = _value(m)
    if value is None:
        return Reading(symbolic=True, text=text)
    return Reading(value=value, percent=bool(_PERCENT_AFTER.match(rest)), slash=bool(m["den"]), text=text)


def _value(m: re.Match[str]) -> Fraction | None:
    digits = m["num"].replace(",", "").replace(" ", "")
    if len(digits) > MAX_DIGITS:
        raise NumberTooLong(f"a {len(digits)}-digit number (limit {MAX_DIGITS})")
    value = Fraction(digits)
    if m["mixed"]:
        num, den = (int(x) for x in m["mixed"].split("/"))
        if not 0 < num < den or "." in digits:
            return None  # "2 3/2" is no mixed number
        value += Fraction(num, den)
    elif m["den"]:
        if Fraction(m["den"]) == 0:
            return None
        value /= Fraction(m["den"])
    value = _powers(m, value)
    scale = m["scale"] or m["suffix"]
    value *= _SCALES[scale.lower() if m["scale"] else scale] if scale else 1
    value += Fraction(1, 2) if m["half"] else 0
    return -value if bool(m["sign"]) != bool(m["neg"]) else value


def _powers(m: re.Match[str], value: Fraction) -> Fraction:
    exponent = m["exp"] or m["exp10"]
    if exponent is not None:
        if abs(int(exponent)) > MAX_DIGITS:
            raise NumberTooLong(f"10^{exponent} (limit {MAX_DIGITS} digits)")
        return value * Fraction(10) ** int(exponent)
    if m["pow"] is not None:
        power = int(m["pow"])
        if power * max(1, len(str(abs(value.numerator)))) > MAX_DIGITS:
            raise NumberTooLong(f"{m['num']}^{power} (limit {MAX_DIGITS} digits)")
        return value ** power
    return value


def _word_number(t: str) -> Reading | None:
    """"eighteen", "twenty-five" at the start of an answer."""
    m = _WORD_NUMBER.match(t.lower())
    if m is None:
        return None
    if m["tens"]:
        value = _WORDS[m["tens"]] + (_WORDS[m["unit"]] if m["unit"] else 0)
    elif m["small"] in _WORDS:
        value = _WORDS[m["small"]]
    else:
        return None
    rest = t[m.end():]
    if re.search(r"\d", rest) or _OPERATOR_AFTER.match(rest):  # "three times 6 = 18": not the three
        return None
    return HEDGE if _ALTERNATIVE_AFTER.match(rest) else Reading(value=Fraction(value), text=t[:m.end()])


def canonical(value: Fraction, slash: bool = False) -> str:
    """"18", "-0.5", "3/4": an integer, a terminating decimal, else (or when written so) a fraction."""
    if value.denominator == 1:
        return str(value.numerator)
    den, places = value.denominator, 0
    while den % 10 == 0 or den % 2 == 0 or den % 5 == 0:
        den //= 10 if den % 10 == 0 else (2 if den % 2 == 0 else 5)
        places += 1
    if slash or den != 1:
        return f"{value.numerator}/{value.denominator}"
    scaled = abs(value.numerator) * 10**places // value.denominator
    whole, frac = divmod(scaled, 10**places)
    return f"{'-' if value < 0 else ''}{whole}.{str(frac).zfill(places).rstrip('0')}"
