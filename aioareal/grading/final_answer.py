"""Finding the final answer of a math completion (or a GSM8K gold solution) the way a person reads it:
the last answer it commits to (the rules, with examples: docs/rewards.md#which-answer-is-final).

By how explicit the commitment is: 1. the final `\\boxed{}` (the last one opened); 2. a `####` marker
followed by a number (not a heading); 3. the last answer phrase that is not negated; 4. the last number
of the final statement (trailers cut off: `trailers`). Prose after 1-3 replaces the answer only when
it commits again (a later answer phrase, or a retraction followed by a new final statement). What the
answer says is read by `numbers.read_span` / `numbers.read_last`. Every step is linear in the text,
and only the last `MAX_CHARS` are read (docs/reliability.md#the-grader).

Where each `\\boxed{}` (or `\\fbox{}`) of a text opens and closes, in one pass over its braces.
Only boxes with no box inside count as answers; the last box opened is the final one, unfinished if
it never closes (a completion cut off at its token limit).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from itertools import repeat

from .latex import clean
from .number_words import last_words
from .numbers import HEDGE, NOTHING, Reading, canonical, leading, read_last, read_span, trim
from .trailers import is_trailer, strip_trailers

# "answer is", "final answer:", "answer would be" (matched from "answer": `_phrase` finds it by `rfind`).
_PHRASE = re.compile(r"(?<!\w)answer\b\**\s*(?:(?:is|was|would\s+be|should\s+be|will\s+be|equals)\b|[:=])\**",
                     re.IGNORECASE)
_ANSWER = ("answer", "Answer", "ANSWER")
_NEGATED = re.compile(r"\s*+(?:\*+\s*+)?(?:(?:definitely|certainly|clearly|actually)\s++)?"
                      r"(?:not|never|no\s++longer|n't)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
_HEADING = re.compile(r"[\s*$]*+-?[\d.,]+[.:)]\s+[A-Za-z]")  # "#### 1. Eggs laid per day"
_MARKER_START = re.compile(r"[\s*]*+(?:\\?\$\s*+)?(?:[-\u2212]\s*+)?(?:\\?\$\s*+)?\.?\d")
# A sentence that only names a rejected alternative ("So she pays $12. Not 15."): no final statement.
_ONLY_REJECTS = re.compile(r"[\s*_(\-—–]*+(?:(?:and|but)\s++)?(?:not|never)\b(?!\s++(?:only|just)\b)", re.I)
_TURN = re.compile(r"[;,]|\b(?:but|so|instead|rather)\b", re.IGNORECASE)  # after a negation: a new statement
_BREAKS = (". ", ".\n", "! ", "? ", "\n")
# No two adjacent quantifiers can take the same characters (possessive `*+` where they could).
MAX_CHARS = 8192  # 4-5 times the longest GSM8K completion of a 1,024-token budget
_CAP_ALIGN = 64
_SPAN_LIMIT = 300  # an answer phrase or marker line longer than this is not one answer
_CUT_OFF = ",;:(-+=/\\{"  # a text ending in these (or a letter) stopped mid-sentence: cut off at its token limit
_QUESTIONS = 3  # questions skipped looking for the final statement (bounded: each skip rescans)
_LIST_MARKER = re.compile(r"[ \t]*(?:[-*][ \t]*)?\d{1,3}[.)][ \t]+(?=\S)")
# A retraction: an interjection that stops to reconsider, or an error owned in the first person ("the
# mistake many people make is ..." retracts nothing).
_RETRACTION = re.compile(r"\b(?:wait|oops|hmm+|hold on|on second thought|correction:|my (?:mistake|error|bad)|"
                         r"(?:i|we) (?:made an? (?:mistake|error)|forgot|missed|overlooked|miscalculated|misread)|"
                         r"(?:that|this)(?: is|'s| was) (?:wrong|incorrect|not right)|re-?checking|recalculating|"
                         r"(?:let me|let's|i'll|i need to|i should) (?:re-?check|re-?calculate|re-?do|re-?evaluate|"
                         r"reconsider|correct|fix))\b", re.IGNORECASE)
# Between two boxes, or after the final one: alternatives, not a correction.
_BOXES_HEDGED = re.compile(r"[\s$*\\()\[\],;/&]*+(?:(?:either|or|and|maybe|possibly|perhaps)[\s$*\\()\[\],;/&]*+)*+")
_OR_AFTER = re.compile(r"[\s$*\\)\]}]*+(?:or|/)\s*+(?:(?:maybe|possibly|perhaps)\s*+)?\\?\$?\s*+[-.]?\d", re.IGNORECASE)


@dataclass(frozen=True)
class Found:
    text: str  # the answer as written: box contents, marker line, the phrase's number or formula
    reading: Reading
    source: str  # "boxed", "hashes", "phrase" or "last"
    void: bool = False  # commits to no answer: an empty or unfinished final box
    end: int = 0  # where the statement of the answer ends in the text


def find_answer(text: str) -> Found | None:
    """The answer `text` commits to last, or None; `end` is in the whole text's terms."""
    text, offset = capped(text)
    text = text.replace("\u2212", "-")
    for find in (_boxed, _hashes, _phrase):
        found = find(text)
        if found is not None:
            return _shifted(_revised(text, found), offset)
    found = _last_statement(text)
    return _shifted(found, offset) if found is not None else None


def capped(text: str) -> tuple[str, int]:
    """The last `MAX_CHARS` characters of `text` (from a space or line break in the first
    `_CAP_ALIGN` of them, so no number is cut in half), and where they start in `text`. The final
    answer is the last commitment, so it lies in the tail."""
    if len(text) <= MAX_CHARS:
        return text, 0
    cut = len(text) - MAX_CHARS
    space = next((i for i in range(cut, cut + _CAP_ALIGN) if text[i].isspace()), cut)
    return text[space:], space


def extract_answer(text: str) -> str | None:
    """The final answer of a completion or a GSM8K gold solution as written, or None if it has none."""
    found = find_answer(text)
    return found.text if found is not None and not found.void else None


def normalize_number(s: str) -> str | None:
    """Canonical string of a plain number ("$1,234.50" -> "1234.5", "\\frac{3}{4}" -> "3/4"), None if
    `s` is not exactly one number with optional units (a formula, a hedge, prose)."""
    t = trim(clean(s.replace("\u2212", "-")))
    reading = leading(t) if t else None
    if reading is None or reading.value is None:
        return None
    return canonical(reading.value, reading.slash)


def box_contents(text: str) -> list[str]:
    """Contents of every closed `\\boxed{}` that holds no other box, in order."""
    return [box.text(text) for box in scan(text)[0]]


def _boxed(text: str) -> Found | None:
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    leaves, final = scan(text)
    if final is None:
        return None
    if final.close is None:  # cut off inside the final box
        return Found("", NOTHING, "boxed", void=True, end=len(text))
    contents = final.text(text).strip()
    if not contents:  # an empty box commits to nothing; prose after it may ("... within \boxed{}. The answer is 18")
        rest = text[final.close + 1:]
        later = _hashes(rest) or _phrase(rest) or _last_statement(rest)
        return _shifted(later, final.close + 1) if later else Found("", NOTHING, "boxed", void=True, end=len(text))
    reading = read_span(contents)
    if _OR_AFTER.match(text, final.close + 1) or _alternatives(text, leaves, reading):
        reading = replace(HEDGE, text=contents)
    return Found(contents, reading, "boxed", end=final.close + 1)


def _alternatives(text: str, leaves: list[Box], reading: Reading) -> bool:
    """The final box offered beside an earlier one with another value ("\\boxed{18} or \\boxed{19}")."""
    if len(leaves) < 2 or leaves[-2].close is None:
        return False
    before, final = leaves[-2], leaves[-1]
    if not _BOXES_HEDGED.fullmatch(text, before.close + 1, final.start):
        return False
    return read_span(before.text(text)).value != reading.value


def _revised(text: str, found: Found) -> Found:
    """`found`, unless prose after it commits again: a later answer phrase, or a retraction followed
    by a new final statement (a check after the answer is no retraction)."""
    if found.void or found.end >= len(text):
        return found
    later = _phrase(text, found.end)
    if later is not None:
        return _revised(text, later)
    retraction = _RETRACTION.search(text, found.end)
    if retraction is None or is_trailer(text[retraction.start():]):
        return found
    statement = _last_statement(text[retraction.start():])
    return _shifted(statement, retraction.start()) if statement is not None else found


def _hashes(text: str) -> Found | None:
    end = len(text)
    while (pos := text.rfind("####", 0, end)) != -1:
        end = pos
        line = text[pos + 4:pos + 4 + _SPAN_LIMIT].split("\n", 1)[0]
        if line.startswith("#") or not _MARKER_START.match(line) or _HEADING.match(line):
            continue  # "##### Step 2", "#### Final Answer", "#### 1. Eggs": headings
        reading = read_span(line)
        if reading.value is not None or reading.hedged or reading.symbolic:
            return Found(line.strip(), reading, "hashes", end=pos + 4 + len(line))
    return None


def _phrase(text: str, start: int = 0) -> Found | None:
    """The last answer phrase of `text[start:]` that is not negated, found from the end by `rfind`
    (far faster than a case-insensitive regex scan), each spelling resuming where it stopped: linear."""
    found = [text.rfind(word, start) for word in _ANSWER]  # each spelling's last place, searched back once
    while (i := max(found)) >= 0:
        k = found.index(i)
        found[k] = text.rfind(_ANSWER[k], start, i)
        m = _PHRASE.match(text, i)
        if m is None or _NEGATED.match(text, m.end()):
            continue
        span, end = _phrase_span(text, m.end())
        reading = read_span(span)
        if reading == NOTHING:
            return None  # the last answer phrase says nothing readable: read the final sentence
        shown = reading.text if reading.value is not None else span.strip().strip("*").rstrip(".").strip()
        return Found(shown, reading, "phrase", end=end)
    return None


def _phrase_span(text: str, start: int) -> tuple[str, int]:
    """The phrase's span to its sentence's end (the next line's, when it ends its line), and that end."""
    window = text[start:start + _SPAN_LIMIT]
    end = _SENTENCE_END.search(window)
    span = window[:end.start()] if end else window
    if not re.search(r"\w", span) and end is not None and window[end.start()] == "\n":
        after = start + end.end()
        rest = text[after:after + _SPAN_LIMIT]
        nxt = _SENTENCE_END.search(rest, len(rest) - len(rest.lstrip()))
        return (rest[:nxt.start()] if nxt else rest), after + (nxt.start() if nxt else len(rest))
    return span, start + len(span)


def _last_statement(text: str) -> Found | None:
    """The last number of the final statement, once trailing checks, notes and asides are cut off."""
    text = strip_trailers(text)
    bounds = _final_statement(text)
    if bounds is None:
        return None
    sentence = text[bounds[0]:bounds[1]]
    negated = [m for m in _PHRASE.finditer(sentence) if _NEGATED.match(sentence, m.end())]
    if negated and not _TURN.search(sentence, negated[-1].end()):
        return None  # "The answer is not 16.": no answer
    reading = read_last(sentence)
    if reading == NOTHING:
        return None
    return Found(reading.text, reading, "last", end=len(text))


def _final_statement(text: str) -> tuple[int, int] | None:
    """Where the final statement is: the unfinished last sentence of a text cut off mid-sentence, the
    last item of a numbered list, else the last sentence with a number that is not a question (a few
    are skipped, then nothing is)."""
    end = len(text.rstrip())
    if end and (text[end - 1].isalpha() or text[end - 1] in _CUT_OFF):
        return _sentence_start(text, end), end
    for _ in range(_QUESTIONS):
        bounds = _last_numbered_sentence(text, end)
        if bounds is None or not (_only_rejects(text, *bounds) or "?" in (
                text[bounds[1]:bounds[1] + 1], text[bounds[0]:bounds[1]].rstrip()[-1:])):
            return bounds
        end = bounds[0]
    return None


def _only_rejects(text: str, start: int, end: int) -> bool:
    """The sentence only names a rejected alternative ("Not 15."; "Not 15, but 12." states 12)."""
    m = _ONLY_REJECTS.match(text, start, end)
    return m is not None and _TURN.search(text, m.end(), end) is None


def _last_numbered_sentence(text: str, end: int) -> tuple[int, int] | None:
    pos = max(map(text.rfind, "0123456789", repeat(0), repeat(end)))
    words = last_words(text, _sentence_end(text, pos, end) if pos >= 0 else 0, end)
    if words is not None:  # "... = 18. So she makes twenty dollars a day."
        pos = words[1]
    if pos < 0:
        return None
    marker = _LIST_MARKER.match(text, text.rfind("\n", 0, pos) + 1)
    if marker is not None and marker.end() > pos:  # "20. Each window is ...": the item, not its number
        return marker.end(), _sentence_end(text, marker.end(), end)
    return _sentence_start(text, pos), _sentence_end(text, pos, end)


def _sentence_start(text: str, pos: int) -> int:
    return max((text.rfind(b, 0, pos) + len(b) for b in _BREAKS if text.rfind(b, 0, pos) >= 0), default=0)


def _sentence_end(text: str, pos: int, end: int | None = None) -> int:
    """Where the sentence at `pos` ends: at its break ("." or "?" + space, a line break), or `end`."""
    end = len(text) if end is None else end
    ends = [i for i in (text.find(b, pos, end) for b in _BREAKS) if i >= 0]
    return min(ends) if ends else end


def _shifted(found: Found, offset: int) -> Found:
    """`found` in a part of the text that starts at `offset`, with `end` in the whole text's terms."""
    return replace(found, end=found.end + offset)


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")


@dataclass(frozen=True)
class Box:
    start: int  # where `\boxed` begins
    contents: int  # where its contents begin (after the brace)
    close: int | None = None  # the index of its closing brace; None if it never closes

    def text(self, source: str) -> str:
        return source[self.contents:self.close] if self.close is not None else ""


def scan(text: str) -> tuple[list[Box], Box | None]:
    """(the closed boxes that hold no other box, in order; the last box opened, closed or not)."""
    opened = {m.end() - 1: (m.start(), m.end()) for m in _BOX.finditer(text)}
    if not opened:
        return [], None
    last_brace = max(opened)
    final = Box(*opened[last_brace])
    stack: list[tuple[int | None, int]] = []  # (the brace's index if a box's, leaf boxes found when opened)
    leaves: list[Box] = []
    for m in _BRACE.finditer(text, min(opened)):
        i = m.start()
        if text[i] == "{":
            stack.append((i if i in opened else None, len(leaves)))
        elif stack:
            brace, seen = stack.pop()
            if brace is not None and seen == len(leaves):  # a box with no box inside
                leaves.append(Box(*opened[brace], close=i))
    if leaves and leaves[-1].contents == final.contents:
        final = leaves[-1]
    return leaves, final
