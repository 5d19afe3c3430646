"""Numerals and their exact values: `NUMBER` recognises one written numeral in cleaned text (a sign,
a currency symbol, digits with separators and decimals, then at most one of a mixed fraction, a
fraction, scientific notation or a power, then a scale and `and a half`); `numeral_value(m)` is its
exact Fraction, `canonical` writes one back. Numbers past Python's integer digit limit raise
`NumberTooLong` (a ValueError the reward service counts). The pattern is linear in its input.
"""
from __future__ import annotations

import re
import sys
from fractions import Fraction

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
