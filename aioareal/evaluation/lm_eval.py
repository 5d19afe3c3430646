"""GSM8K scored as lm-evaluation-harness's `gsm8k` task scores it (version 3), the figure model cards
and leaderboards quote: pure functions, no model, no files.

- The prompt: five solved train questions, each `Question: {question}\\nAnswer: {solution}`, joined
  and followed by the test question by blank lines, ending `Question: {question}\\nAnswer:`; no chat
  template, no instruction. The harness draws its five shots per question from a seeded shuffle of
  the train split; here they are the first five train rows, the same for every question (docs/evaluate.md
  says what that changes).
- Decoding: greedy, at most 256 new tokens, ending at `Question:`, `</s>` or `<|im_end|>` (and at
  the model's EOS); the text is cut at the first of them.
- Two extractions, each an exact match against the reference's `#### N` after dropping commas,
  dollar signs, a trailing full stop and case: `strict-match`, the number after the first `#### `
  the model writes; `flexible-extract`, the last number-like run in the completion.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

SHOTS = 5
MAX_NEW_TOKENS = 256  # the harness's max_gen_toks
STOP = ("Question:", "</s>", "<|im_end|>")
INVALID = "[invalid]"  # the harness's fallback when nothing matches

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def shot(question: str, solution: str) -> str:
    return f"Question: {question}\nAnswer: {solution}"


def prompt(shots: Sequence[tuple[str, str]], question: str) -> str:
    """The few-shot context and the question, as the harness joins them."""
    return "\n\n".join([*(shot(q, a) for q, a in shots), f"Question: {question}\nAnswer:"])


def cut_at_stop(text: str) -> str:
    """The completion up to the first stop string (the harness's `until`)."""
    ends = [i for i in (text.find(s) for s in STOP) if i >= 0]
    return text[:min(ends)] if ends else text


def strict_answer(text: str) -> str:
    found = _STRICT.search(text)
    return found.group(1).strip() if found else INVALID


def flexible_answer(text: str) -> str:
    found = _FLEXIBLE.findall(text)
    if not found:
        return INVALID
    groups = [g for g in found[-1] if g]
    return groups[0].strip() if groups else INVALID


def normalize(text: str) -> str:
    """exact_match's view of an answer: the ignored patterns removed, in order, then lower case."""
    for pattern in _IGNORE:
        text = pattern.sub("", text)
    return text.lower()


def matches(answer: str, reference: str) -> bool:
    """Whether an extracted answer equals the reference solution's final answer."""
    return answer != INVALID and normalize(answer) == normalize(reference)
