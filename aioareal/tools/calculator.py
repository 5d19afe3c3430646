"""The calculator tool: arithmetic a model writes, evaluated by parsing, never by `eval`.

`ast.parse(mode="eval")` only builds a tree, walked with a whitelist (numbers, + - * / // % **, unary
signs); anything else is refused. Work is bounded before anything is computed (MAX_CHARS of text,
MAX_DIGITS per number and intermediate result, a power only when its result would fit), so a call
costs microseconds whatever the model writes. Numbers are exact fractions; a result prints as an
integer or a decimal of up to 12 significant digits.
"""
from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction

MAX_CHARS = 200  # longer input is refused before it is parsed
MAX_DIGITS = 40  # every operand and intermediate result: |x| < 10**40 (and 1/x too, for non-integers)
MAX_NODES = 64  # operators and numbers in one expression

# Notation models write for the operators Python spells otherwise; thousands separators dropped.
_NORMALISE = {"×": "*", "·": "*", "÷": "/", "^": "**", "−": "-", ",": "", "x": "*"}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class CalculatorError(ValueError):
    """The expression is not plain bounded arithmetic; the message says why (it becomes the observation)."""


def calculate(expression: str) -> str:
    """The value of `expression` as text, e.g. calculate("123*456") == "56088"."""
    text = expression.strip()
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    for old, new in _NORMALISE.items():
        text = text.replace(old, new)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError("not an arithmetic expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES * 2:  # expression, operator and operand nodes
        raise CalculatorError(f"more than {MAX_NODES} operations")
    return _format(_value(tree.body))


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError(f"number over {MAX_DIGITS} digits")
        return _bounded(Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_value(node.left), _value(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if right == 0 and not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            raise CalculatorError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    raise CalculatorError(f"unsupported: {type(node).__name__.lower()} (numbers and + - * / // % ** only)")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    """base ** exponent for an integer exponent, refused before computing a result out of bounds."""
    if exponent.denominator != 1:
        raise CalculatorError("only integer exponents")
    n = int(exponent)
    if base == 0:
        if n < 0:
            raise CalculatorError("division by zero")
        return Fraction(0 if n else 1)
    size = max(abs(_log10(base.numerator)), abs(_log10(base.denominator)))
    if abs(n) * size > MAX_DIGITS:
        raise CalculatorError(f"result over {MAX_DIGITS} digits")
    return _bounded(base ** n)


def _log10(n: int) -> float:
    return math.log10(abs(n)) if n else 0.0


def _bounded(x: Fraction) -> Fraction:
    limit = 10 ** MAX_DIGITS
    if abs(x.numerator) >= limit or x.denominator >= limit:
        raise CalculatorError(f"number over {MAX_DIGITS} digits")
    return x


def _format(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    return format(float(x), ".12g")
