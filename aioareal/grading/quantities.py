"""Quantities written in units that pair ("18 dollars and 50 cents", "3 hours 20 minutes"): one
answer, not a list, accepted in any unit it is written in (18.5 dollars or 1850 cents), since the
grader does not know which the question asked for. Units must fall in size within one dimension.
One regex match per unit: linear.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

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
