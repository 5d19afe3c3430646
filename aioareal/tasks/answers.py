"""Final-answer extraction and number normalisation for math completions and GSM8K gold solutions.

`extract_answer` finds the answer a text commits to, in order of how explicit the commitment is:
the last `\\boxed{...}`, the text after the last `####` (GSM8K's gold format), an "the answer is X" /
"answer: X" phrase, and finally the last number in the text. `normalize_number` turns an answer
into a canonical number string ("$1,234.50" -> "1234.5") or None when it is not a plain number,
so that most comparisons are decided without a symbolic verifier.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# A number as written in prose: thousands groups (1,234,567) or plain digits, optional decimals.
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_LAST_NUMBER = re.compile(rf"(?:(?<![\w)])-)?{_NUMBER}(?:\s*/\s*\d+)?")  # "10-3": 3, not -3
_PHRASE = re.compile(r"(?:the\s+(?:final\s+)?answer\s+is|answer\s*:)[\s:*]*(.+)", re.IGNORECASE)
_NUMBER_THEN_PROSE = re.compile(rf"(\$?\s*-?{_NUMBER}(?:\s*/\s*\d+)?%?)\s+[A-Za-z]")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# The canonical forms normalize_number accepts after LaTeX clean-up: sign, number or a/b, then units.
# A unit is %, or a word after the number ("5 m", "7 apples", "5cm", "5m"), except that letters stuck
# to the number starting with x, y or z, or "pi", are algebra ("5x", "2xy", "3pi"), not a unit.
_PLAIN = re.compile(rf"([+-]?)\s*({_NUMBER}|\d+\s*/\s*\d+)(?:\s*%|\s+[A-Za-z][A-Za-z'/. -]*|(?![xyzXYZ]|pi\b)[A-Za-z][A-Za-z'/. -]*)?\.?")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_LATEX_SYMBOLS = (("{,}", ","), ("\\$", ""), ("$", ""), ("\\%", "%"), ("\\!", ""), ("\\,", ""), ("\\;", ""))


def extract_answer(text: str) -> str | None:
    """The final answer a completion (or a GSM8K gold solution) commits to, or None if it has none."""
    text = text.replace("\u2212", "-")  # unicode minus
    for extract in (_last_boxed, _after_hashes, _answer_phrase, _last_number):
        answer = extract(text)
        if answer and extract in (_after_hashes, _answer_phrase) and _is_prose(answer):
            # "#### The answer is 18", "answer: first add 3 and 4 to get 7": a sentence, not an
            # answer; take the answer phrase inside it, else the sentence's last number.
            inner = _answer_phrase(answer)
            answer = inner if inner and not _is_prose(inner) else _last_number(answer)
        if answer:
            return answer
    return None


def _is_prose(answer: str) -> bool:
    """Starts with a word and runs three words or more, and is no number with units ("7 apples")."""
    return bool(re.match(r"[A-Za-z]{2,}", answer)) and len(answer.split()) >= 3 and normalize_number(answer) is None


def _last_boxed(text: str) -> str | None:
    """Contents of the last balanced `\\boxed{...}` (nested braces allowed; a truncated one is skipped)."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def _after_hashes(text: str) -> str | None:
    if "####" not in text:
        return None
    rest = text.rsplit("####", 1)[1].strip()
    return rest.splitlines()[0].strip() if rest else None


def _answer_phrase(text: str) -> str | None:
    matches = list(_PHRASE.finditer(text))
    if not matches:
        return None
    phrase = matches[-1].group(1).strip()
    phrase = re.split(r"\.\s|\n", phrase, maxsplit=1)[0]  # up to the end of the sentence
    phrase = phrase.strip().strip("*").rstrip(".").strip()
    prose = _NUMBER_THEN_PROSE.match(phrase)  # "5 because 2+3=5": keep the 5, drop the reasoning
    return (prose.group(1) if prose else phrase) or None


def _last_number(text: str) -> str | None:
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize_number(s: str) -> str | None:
    """Canonical string of a plain number, or None if `s` is not one.

    Strips `$`, thousands commas, a trailing `.` and trailing units (`%`, words, `\\text{...}`);
    `12.50` -> `12.5`, `7.0` -> `7`, `-3` -> `-3`; `3/4` and `\\frac{3}{4}` -> `3/4` (kept as a
    fraction, compared numerically by the verifier).
    """
    t = s.strip().replace("\u2212", "-")  # unicode minus
    t = _LATEX_TEXT.sub(r" \1", t)
    t = _LATEX_FRAC.sub(r"\1/\2", t)
    for latex, plain in _LATEX_SYMBOLS:
        t = t.replace(latex, plain)
    t = t.strip()
    match = _PLAIN.fullmatch(t)
    if match is None:
        return None
    sign, number = match.group(1), match.group(2).replace(",", "").replace(" ", "")
    if "/" in number:
        num, den = number.split("/")
        return None if int(den) == 0 else f"{'-' if sign == '-' else ''}{int(num)}/{int(den)}"
    try:
        value = Decimal(number)
    except InvalidOperation:
        return None
    value = -value if sign == "-" else value
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")
