"""What follows a completion's final statement and is no part of it: a verification, a note, a
parenthesised aside, a sign-off. When the answer is read from the final sentence, `strip_trailers`
cuts them off first.

A trailer starts a line or sentence with one of the headings below (a check word needs a colon or a
line of its own: "Check how many are left" is a step) and runs to the end. It is cut only after
something with a digit, and only if it holds no word that concludes or corrects (a check that finds a
mistake and states a new result is the final statement). An aside is a parenthesised group ending
the text after a sentence end. Each step is one forward or backward scan: linear.
"""
from __future__ import annotations

import re

# A heading's words are found first, then checked to start a line or sentence (`_LEAD`): a pattern
# opening with the lookbehinds would try them at every position.
_WORDS = re.compile(
    r"(?:check(?:ing)?|verif(?:y|ication|ying)|double[- ]?check(?:ing)?|sanity check)"
    r"[ \t]*+(?:\*+[ \t]*+)?(?:[:—]|\n|$)|"
    r"(?:to (?:check|verify)|let(?:'s|’s| me| us) (?:double[- ]?)?(?:check|verify|confirm)|note|nb|p\.?s\.?|"
    r"this (?:makes sense|checks out|is correct|matches|is consistent|confirms)|"
    r"(?:i )?hope (?:it|this|that)|let me know|feel free)\b", re.I | re.M)
_LEAD = re.compile(r"(?:(?<![\s\S])|(?<=\n)|(?<=[.!?:]\s)|(?<=[.!?:]\s\s))[\s>#*_\-(]*"
                   r"(?:(?:wait|ok|okay|now|also|finally|and)[,.!]?\s+)?$", re.I)
_LEAD_SPAN = 24  # characters before a heading's words that `_LEAD` looks at
# Substrings of every heading, tested (C-speed `in`) before `_WORDS` scans: most completions have none.
_GATE = ("check", "verif", "confirm", "note", "nb", "p.s", "ps:", "\nps ", "this makes", "this checks", "this is c",
         "this matches", "hope", "let me know", "feel free")
_DIGIT = re.compile(r"\d")
_KEEPS = re.compile(r"\b(?:so|therefore|thus|hence|answer|instead|should be|not|wrong|incorrect|mistake|error|oops|"
                    r"actually)\b|n't\b", re.I)


def strip_trailers(text: str) -> str:
    """`text` without the trailers that follow its final statement (the text itself if none)."""
    first_digit = _DIGIT.search(text)
    if first_digit is None:
        return text
    end = _before_asides(text, len(text), first_digit.start())
    lower = text.lower()
    if not any(word in lower for word in _GATE):
        return text[:end]
    heading = _heading(text, first_digit.end(), end)
    keep = None
    for keep in _KEEPS.finditer(text, heading[0] if heading else end, end):  # noqa: B007 (the last one is kept)
        pass
    if keep is not None:  # a trailer holds no concluding or correcting word: look after the last one
        heading = _heading(text, keep.end(), end)
    if heading is not None:
        end = _before_asides(text, heading[0], first_digit.start())
    return text[:end]


def is_trailer(text: str) -> bool:
    """Whether `text` as a whole is a trailer ("Wait, let me double-check: 9 × 2 = 18 ✓")."""
    heading = _heading(text, 0, min(len(text), 2 * _LEAD_SPAN))
    return heading is not None and heading[0] == 0 and _KEEPS.search(text, heading[1]) is None


def _heading(text: str, pos: int, end: int) -> tuple[int, int] | None:
    """(where the first trailer heading in `text[pos:end]` starts, where its words end), or None."""
    for words in _WORDS.finditer(text, pos, end):
        lead = _LEAD.search(text, max(pos, words.start() - _LEAD_SPAN), words.start())
        if lead is not None:
            return lead.start(), words.end()
    return None


def _before_asides(text: str, end: int, first_digit: int) -> int:
    """Where `text[:end]` ends without the parenthesised groups that close it and follow a sentence end
    or a line break ("... a day. (She keeps 7.)"). Scans back over what it drops, and a little more."""
    while True:
        j, _ = _back_over_space(text, end)
        if j and text[j - 1] == ".":
            j, _ = _back_over_space(text, j - 1)
        if not j or text[j - 1] != ")":
            return end
        opening = _opening(text, j - 1)
        if opening is None or opening <= first_digit:
            return end
        k, newline = _back_over_space(text, opening)
        if not (newline or text[k - 1] in ".!?:"):
            return end
        end = opening


def _back_over_space(text: str, end: int) -> tuple[int, bool]:
    """The index after the last non-space character before `end`, and whether a line break was skipped."""
    newline = False
    while end and text[end - 1].isspace():
        end -= 1
        newline = newline or text[end] == "\n"
    return end, newline


def _opening(text: str, close: int) -> int | None:
    """Index of the "(" that matches the ")" at `close`, scanning back; None if unmatched."""
    depth = 0
    for i in range(close, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return None
