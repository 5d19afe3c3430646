"""Where each `\\boxed{}` (or `\\fbox{}`) of a text opens and closes, in one pass over its braces.
Only boxes with no box inside count as answers; the last box opened is the final one, unfinished if
it never closes (a completion cut off at its token limit).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

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
