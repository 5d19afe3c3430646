"""Finding the final answer of a math completion (or a GSM8K gold solution) the way a person reads it.

In order of how explicit the commitment is:
1. the last `\\boxed{}` (`\\fbox{}`); boxes that disagree with each other mark the answer as a
   conflict (two different boxed answers are no answer);
2. a `####` marker followed by a number, GSM8K's gold format (`#### Step 2: Revenue`, `#### Final
   Answer` and `#### 1. Eggs` are markdown headings, not answers);
3. the last "the answer is ..." / "answer: ..." phrase that is not negated ("the answer is not simply
   16; ... so she makes 18" reads 18), up to the end of its sentence (or the next line when the
   phrase ends its line);
4. the last number of the final sentence that has one.
What the answer says is then read by `numbers.read_span` / `numbers.read_last` (hedges, units,
thousands separators, scale words). Every step is linear in the length of the text: the box scan is
one pass over the braces, markers and phrases are found by scans that never revisit characters.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .latex import clean
from .numbers import Reading, canonical, leading, read_last, read_span

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")
_PHRASE = re.compile(r"\b(?:final\s+answer|answer)\b\**\s*(?:(?:is|was|would\s+be|should\s+be|will\s+be|equals)\b|[:=])"
                     r"\**", re.IGNORECASE)
_NEGATED = re.compile(r"\s*\**\s*(?:(?:definitely|certainly|clearly|actually)\s+)?(?:not|never|no\s+longer|n't)\b",
                      re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
_HEADING = re.compile(r"[\s*$]*-?[\d.,]+[.:)]\s+[A-Za-z]")  # "#### 1. Eggs laid per day"
_MARKER_START = re.compile(r"[\s*]*(?:\\?\$)?\s*[-\u2212]?\s*(?:\\?\$)?\s*\.?\d")
_BREAKS = (". ", ".\n", "! ", "? ", "\n")
_SPAN_LIMIT = 300  # an answer phrase or marker line longer than this is not one answer


@dataclass(frozen=True)
class Found:
    text: str  # the answer as written: box contents, marker line, the phrase's number or formula
    reading: Reading
    source: str  # "boxed", "hashes", "phrase" or "last"
    conflict: bool = False  # boxed answers that disagree


def find_answer(text: str) -> Found | None:
    """The answer `text` commits to, or None when it commits to none."""
    text = text.replace("\u2212", "-")
    for find in (_boxed, _hashes, _phrase, _last_sentence):
        found = find(text)
        if found is not None:
            return found
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion or a GSM8K gold solution as written, or None if it has none."""
    found = find_answer(text)
    return found.text if found is not None else None


def normalize_number(s: str) -> str | None:
    """Canonical string of a plain number ("$1,234.50" -> "1234.5", "\\frac{3}{4}" -> "3/4"), None if
    `s` is not exactly one number with optional units (a formula, a hedge, prose)."""
    t = clean(s.replace("\u2212", "-")).strip(" .")
    reading = leading(t) if t else None
    if reading is None or reading.value is None:
        return None
    return canonical(reading.value, reading.slash)


def box_contents(text: str) -> list[str]:
    """Contents of every closed `\\boxed{}` that holds no other box, in order (one pass over the braces;
    an unclosed box is skipped)."""
    starts = {m.end() - 1: m.end() for m in _BOX.finditer(text)}
    if not starts:
        return []
    stack: list[tuple[int | None, int]] = []  # (contents start if a box, leaf boxes found when opened)
    leaves: list[tuple[int, int]] = []
    for m in _BRACE.finditer(text, min(starts)):
        i = m.start()
        if text[i] == "{":
            stack.append((starts.get(i), len(leaves)))
        elif stack:
            start, seen = stack.pop()
            if start is not None and seen == len(leaves):  # a box with no box inside
                leaves.append((start, i))
    return [text[a:b] for a, b in leaves]


def _boxed(text: str) -> Found | None:
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    contents = [c.strip() for c in box_contents(text)]
    contents = [c for c in contents if c]
    if not contents:
        return None
    readings = {c: read_span(c) for c in dict.fromkeys(contents)}
    values = {r.value for r in readings.values() if r.value is not None}
    return Found(contents[-1], readings[contents[-1]], "boxed", conflict=len(values) > 1)


def _hashes(text: str) -> Found | None:
    end = len(text)
    while (pos := text.rfind("####", 0, end)) != -1:
        end = pos
        line = text[pos + 4:pos + 4 + _SPAN_LIMIT].split("\n", 1)[0]
        if line.startswith("#") or not _MARKER_START.match(line) or _HEADING.match(line):
            continue  # "##### Step 2", "#### Final Answer", "#### 1. Eggs": headings
        reading = read_span(line)
        if reading.value is not None or reading.hedged or reading.symbolic:
            return Found(line.strip(), reading, "hashes")
    return None


def _phrase(text: str) -> Found | None:
    for m in reversed(list(_PHRASE.finditer(text))):
        if _NEGATED.match(text, m.end()):
            continue
        span = _phrase_span(text, m.end())
        reading = read_span(span)
        if reading == Reading():
            return None  # the last answer phrase says nothing readable: read the final sentence
        shown = reading.text if reading.value is not None else span.strip().strip("*").rstrip(".").strip()
        return Found(shown, reading, "phrase")
    return None


def _phrase_span(text: str, start: int) -> str:
    """From the phrase to the end of its sentence; the next line when the phrase ends its line."""
    window = text[start:start + _SPAN_LIMIT]
    end = _SENTENCE_END.search(window)
    span = window[:end.start()] if end else window
    if not re.search(r"\w", span) and end is not None and window[end.start()] == "\n":
        rest = text[start + end.end():start + end.end() + _SPAN_LIMIT].lstrip()
        nxt = _SENTENCE_END.search(rest)
        span = rest[:nxt.start()] if nxt else rest
    return span


def _last_sentence(text: str) -> Found | None:
    pos = max(text.rfind(d) for d in "0123456789")
    if pos < 0:
        return None
    start = max((text.rfind(b, 0, pos) + len(b) for b in _BREAKS if text.rfind(b, 0, pos) >= 0), default=0)
    ends = [i for i in (text.find(b, pos) for b in _BREAKS) if i >= 0]
    sentence = text[start:min(ends) if ends else len(text)]
    negated = [m for m in _PHRASE.finditer(sentence) if _NEGATED.match(sentence, m.end())]
    if negated and not re.search(r"[;,]|\b(?:but|so|instead|rather)\b", sentence[negated[-1].end():]):
        return None  # "The answer is not 16.": no answer
    reading = read_last(sentence)
    if reading == Reading():
        return None
    return Found(reading.text, reading, "last")
