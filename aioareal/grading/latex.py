"""LaTeX and typography reduced to the plain text a grader reads: `clean("1{,}080\\text{ cm}^{2}")`
is "1,080 cm^2". What survives is what decides a number: digits, separators, signs, `/`, `^`, `%`,
`$`, operators as single characters, and words; text macros keep their contents, LaTeX spaces become
plain ones, numeric `\\frac{a}{b}` becomes `a/b`. Unknown commands (`\\sqrt`) stay, so a formula still
looks like one. Every step is a `str.replace` or a regex that cannot backtrack: linear.
"""
from __future__ import annotations

import re

_SPACES = re.compile(r"[\s\u200b]+")  # str patterns: \s covers no-break and thin spaces too
_MACRO = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mathsf|mbox|operatorname|"
                    r"boldsymbol|emph|underline)\s*\{([^{}]*)\}")
# Spaces are collapsed first, so " ?" (never a leading \s*, which rescans runs of spaces) suffices.
_FRAC = re.compile(r"(?:(\d) ?)?\\frac\s*\{\s*(\d+(?:\.\d+)?)\s*\}\s*\{\s*(\d+(?:\.\d+)?)\s*\}")
_FRAC_SHORT = re.compile(r"(?:(\d) ?)?\\frac\s*(\d)\s*(\d)")  # \frac12
_BRACED_POWER = re.compile(r"\^\s*\{\s*([-+]?\d+|°)\s*\}")  # 10^{6} -> 10^6, cm^{2} -> cm^2
_VULGAR = {"½": "1/2", "¼": "1/4", "¾": "3/4", "⅓": "1/3", "⅔": "2/3", "⅕": "1/5", "⅙": "1/6", "⅚": "5/6",
           "⅛": "1/8", "⅜": "3/8", "⅝": "5/8", "⅞": "7/8"}
# Order matters: longer commands before their prefixes (\left before \le, \geq before \ge).
_REPLACE = (("\\left", ""), ("\\right", ""), ("\\displaystyle", ""), ("{,}", ","), ("\\!", ""),
            ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\ ", " "), ("\\qquad", " "), ("\\quad", " "), ("~", " "),
            ("\\$", "$"), ("\\%", "%"), ("\\times", "×"), ("\\cdot", "·"), ("⋅", "·"), ("\\div", "÷"),
            ("\\approx", "≈"), ("\\sim", "≈"), ("\\geq", "≥"), ("\\leq", "≤"), ("\\ge", "≥"), ("\\le", "≤"),
            ("\\pm", "±"), ("^\\circ", "°"), ("\\circ", "°"), ("\\degree", "°"), ("\\dfrac", "\\frac"),
            ("\\tfrac", "\\frac"), ("\u2212", "-"), ("\ufe63", "-"), ("\uff0d", "-"), ("²", "^2"), ("³", "^3"),
            ("**", ""), ("__", ""), ("\\(", " "), ("\\)", " "), ("\\[", " "), ("\\]", " "), ("\\{", ""),
            ("\\}", ""))


def clean(text: str) -> str:
    """Plain text with LaTeX spacing, text macros and numeric fractions resolved; spaces collapsed."""
    text = _SPACES.sub(" ", text)
    for latex, plain in _REPLACE:
        if latex in text:
            text = text.replace(latex, plain)
    for vulgar, plain in _VULGAR.items():
        if vulgar in text:
            text = text.replace(vulgar, " " + plain)
    if "\\" in text:
        for _ in range(2):  # \text{\textbf{18}}: one level per pass
            text = _MACRO.sub(r" \1 ", text)
        text = _FRAC.sub(_fraction, text)
        text = _FRAC_SHORT.sub(_fraction, text)
    if "^" in text:
        text = _BRACED_POWER.sub(r"^\1", text)
    if "{" in text or "}" in text:
        text = text.replace("{", "").replace("}", "")
    return _SPACES.sub(" ", text).strip()


def _fraction(m: re.Match[str]) -> str:
    """`\\frac{1}{2}` -> `1/2`; after a digit it is the fraction of a mixed number: `2\\frac{1}{2}` -> `2 1/2`."""
    whole = f"{m.group(1)} " if m.group(1) else ""
    return f"{whole}{m.group(2)}/{m.group(3)}"
