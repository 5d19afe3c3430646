"""Reading a written answer as a number, the way a careful grader does (docs/rewards.md#reading-the-answer).

An answer is a numeral (`NUMBER`, below), a number in words (`number_words`) or a quantity in paired
units (`read_quantity`, below). What surrounds it decides whether it is one: before it, decoration is fine, a sign
word negates it and a bound is a hedge; right after it, alternatives, ranges and lists are hedges,
an operator makes it part of a formula (`$18/day` is a rate), anything else is units or prose; an
equation is read at the side it concludes with, unless prose comes before its `=`. A hedge equals
nothing. Every pattern is linear in its input (no unbounded repetition after an optional prefix).

Numerals and their exact values: `NUMBER` recognises one written numeral in cleaned text (a sign,
a currency symbol, digits with separators and decimals, then at most one of a mixed fraction, a
fraction, scientific notation or a power, then a scale and `and a half`); `numeral_value(m)` is its
exact Fraction, `canonical` writes one back. Numbers past Python's integer digit limit raise
`NumberTooLong` (a ValueError the reward service counts). The pattern is linear in its input.

Quantities written in units that pair ("18 dollars and 50 cents", "3 hours 20 minutes"): one
answer, not a list, accepted in any unit it is written in (18.5 dollars or 1850 cents), since the
grader does not know which the question asked for. Units must fall in size within one dimension.
One regex match per unit: linear.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from fractions import Fraction

from .latex import clean
from .number_words import START as WORD_START
from .number_words import last_words, read_words

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


class NumberTooLong(ValueError):
    """A numeral or exponent past Python's integer digit limit (sys.get_int_max_str_digits)."""


def numeral_value(m: re.Match[str]) -> Fraction | None:
    """The exact value of a `NUMBER` match; None when it is no number ("2 3/2", "1/0")."""
    digits = m["num"].replace(",", "").replace(" ", "")
    if len(digits) > MAX_DIGITS:
        raise NumberTooLong(f"a {len(digits)}-digit number (limit {MAX_DIGITS})")
    value = Fraction(int(digits)) if digits.isdigit() else Fraction(digits)  # int: no string parsing
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


# Each dimension's units and their size in its smallest unit.
_DIMENSIONS: tuple[dict[str, int], ...] = (
    {"dollars": 100, "dollar": 100, "bucks": 100, "euros": 100, "euro": 100, "pounds": 100, "cents": 1,
     "cent": 1, "¢": 1, "pence": 1},
    {"weeks": 604800, "week": 604800, "days": 86400, "day": 86400, "hours": 3600, "hour": 3600, "hrs": 3600,
     "hr": 3600, "h": 3600, "minutes": 60, "minute": 60, "mins": 60, "min": 60, "seconds": 1, "second": 1,
     "secs": 1, "sec": 1},
    {"years": 12, "year": 12, "yrs": 12, "months": 1, "month": 1},
    {"miles": 63360, "mile": 63360, "yards": 36, "yard": 36, "yd": 36, "feet": 12, "foot": 12, "ft": 12,
     "inches": 1, "inch": 1, "in": 1},
    {"km": 10**6, "kilometers": 10**6, "kilometres": 10**6, "m": 1000, "meters": 1000, "metres": 1000,
     "meter": 1000, "metre": 1000, "cm": 10, "centimeters": 10, "centimetres": 10, "mm": 1},
    {"pounds": 16, "pound": 16, "lbs": 16, "lb": 16, "ounces": 1, "ounce": 1, "oz": 1},
    {"kg": 1000, "kilograms": 1000, "kilogram": 1000, "g": 1, "grams": 1, "gram": 1},
    {"gallons": 16, "gallon": 16, "gal": 16, "quarts": 4, "quart": 4, "qt": 4, "pints": 2, "pint": 2, "cups": 1,
     "cup": 1},
    {"liters": 1000, "litres": 1000, "liter": 1000, "litre": 1000, "l": 1000, "ml": 1, "milliliters": 1,
     "millilitres": 1},
)
_FIRST_UNIT = re.compile(r" ?([A-Za-z¢]+)\.?(?![A-Za-z])")
_NEXT_PART = re.compile(r",? (?:and )?(\d+(?:\.\d+)?) ?([A-Za-z¢]+)(?![A-Za-z])")
_CURRENCY = "$€£"


@dataclass(frozen=True)
class Quantity:
    """The units after a first number: `values(first)` is the whole quantity in each of its units."""

    units: tuple[str, ...]  # largest first: the first number's unit, then each later part's
    later: tuple[Fraction, ...]  # the numbers after the first
    sizes: dict[str, int]
    end: int  # where the quantity ends in the text

    def values(self, first: Fraction) -> tuple[Fraction, ...]:
        total = first * self.sizes[self.units[0]] + sum(n * self.sizes[u] for n, u in zip(self.later, self.units[1:]))
        return tuple(total / self.sizes[u] for u in self.units)


def read_quantity(text: str, currency: str = "", pos: int = 0) -> Quantity | None:
    """The paired units after a number ending at `pos`, or None; `currency`: the symbol before it."""
    if currency and currency in _CURRENCY:
        units = ["dollars"]
    else:
        m = _FIRST_UNIT.match(text, pos)
        if m is None:
            return None
        units, pos = [m.group(1).lower()], m.end()
    later: list[Fraction] = []
    while (m := _NEXT_PART.match(text, pos)) is not None and _dimension(units + [m.group(2).lower()]):
        units.append(m.group(2).lower())
        later.append(Fraction(m.group(1)))
        pos = m.end()
    sizes = _dimension(units) if later else None
    return Quantity(tuple(units), tuple(later), sizes, pos) if sizes else None


def _dimension(units: list[str]) -> dict[str, int] | None:
    """The dimension in which every unit is known and each is smaller than the one before."""
    for sizes in _DIMENSIONS:
        if all(u in sizes for u in units) and all(sizes[a] > sizes[b] for a, b in zip(units, units[1:])):
            return sizes
    return None
