"""The GSM8K grader is linear in the completion (docs/reliability.md#the-grader): for adversarial
inputs of the ReDoS form prefix + pump * k + suffix, built from what the reading rules look for
(runs of whitespace, answer markers, boxes, digits, separators, number words, braces), grading 8n
characters costs at most 16x grading n (linear is 8x, quadratic 64x); and a thread grading the
worst of them leaves the asyncio event loop's longest gap small (Python's `re` holds the GIL for a
whole match, so a backtracking pattern freezes every coroutine of the process). Growth is
measured, not a wall-clock limit: the best of several batches of this thread's CPU time at each
size, alternating, so a busy machine does not count."""
from __future__ import annotations

import asyncio
import gc
import threading
import time

from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from aioareal.grading.final_answer import MAX_CHARS, capped, find_answer
from aioareal.grading.verify import grade

# What the rules read, and what makes a backtracking pattern try again: each token is a pump part.
TOKENS = (" ", "  ", "\t", "\n", " \n", "*", "**", "answer", "answer is", "Answer:", "The answer is", "is", "not",
          "definitely", "or", "maybe", "\\boxed{", "\\boxed", "\\fbox{", "{", "}", "####", "$", "\\$", "=", "-", "+",
          "/", "1", "12", "007", "1,", ",000", " 000", ".", ".5", "(", ")", "[", ",", ";", ":", "one", "hundred",
          "twenty-", "and", "a half", "check", "Check:", "verify", "note", "wait", "so", "x", "\\frac", "\\text{",
          "^", "%", "dollars", "hours", "rather than", "instead of", "—")
PARTS = st.lists(st.sampled_from(TOKENS), max_size=4).map("".join)
PUMPS = st.lists(st.sampled_from(TOKENS), min_size=1, max_size=3).map("".join)
SIZES = (32, 256, 2048)  # each 8x the one before; all under MAX_CHARS, so the cap plays no part
GROWTH = 16.0  # linear work grows 8x (less with fixed costs), measured up to 7.9x; a quadratic rule 64x
# (half fixed costs at n still leave it 32x). 10x failed once in CI: 25% over linear was too tight.
WORST = ("#### " + " " * 140 + "x", "The answer is" + " " * 130 + "definitely x",  # the shapes that froze it
         "\\boxed{1} or" + " " * 130 + "x", "1. check" + " " * 135 + "x", "Check" + " *" * 70 + "x")


def build(prefix: str, pump: str, suffix: str, n: int) -> str:
    """`pump` repeated over n characters, between `prefix` and `suffix` (the repeated part is what
    grows: a text of one pump and one of many take different paths through the rules)."""
    return prefix + pump * -(-n // len(pump)) + suffix


def per_call(text: str) -> float:
    """CPU seconds per grading of `text` over one batch of at least 2 ms (this thread's CPU time:
    time the machine gives other work is not counted)."""
    calls, start = 0, time.thread_time()
    while (elapsed := time.thread_time() - start) < 0.002 or calls == 0:
        grade("#### 18", text)
        calls += 1
    return elapsed / calls


def growth(small: str, large: str, budget_s: float = 0.5) -> tuple[float, float]:
    """The best seconds per grading of `small` and of `large`, measured in alternating batches (a
    load on the machine slows both alike), up to five rounds or until `budget_s` is spent (a rule
    that already takes that long has failed); measured again, up to three times, while `large`
    grows more than GROWTH times `small`: noise passes, a quadratic rule fails every time."""
    best = [float("inf"), float("inf")]
    for _ in range(3):
        spent, start = 0.0, time.thread_time()
        gc.collect()
        gc.disable()
        try:
            for _ in range(5):
                best = [min(best[0], per_call(small)), min(best[1], per_call(large))]
                if (spent := time.thread_time() - start) > budget_s:
                    break
        finally:
            gc.enable()
        if best[1] <= GROWTH * best[0] or spent > budget_s:
            break
    return best[0], best[1]


@settings(deadline=None, max_examples=30, derandomize=True, phases=(Phase.explicit, Phase.generate))
@given(PARTS, PUMPS, PARTS)
@example("#### ", " ", "x")  # three adjacent whitespace runs in the `####` marker's start
@example("The answer is", " ", "definitely x")  # the negation's runs around its stars
@example("\\boxed{1} or", " ", "x")  # "or maybe" after the final box
@example("1. check", " ", "x")  # a trailer heading's runs around its stars
@example("", "1 ", "/")
@example("", "one ", "x")
@example("", " *", "check x")
def test_grading_grows_linearly(prefix: str, pump: str, suffix: str) -> None:
    texts = [build(prefix, pump, suffix, n) for n in SIZES]
    for short, long, n in zip(texts, texts[1:], SIZES):
        small, large = growth(short, long)
        assert large <= GROWTH * small, (f"{prefix!r} + {pump!r} * k + {suffix!r}: {n} chars {small * 1e3:.3f} ms, "
                                         f"{8 * n} chars {large * 1e3:.3f} ms ({large / small:.1f}x)")


def test_a_grading_thread_leaves_the_event_loop_running() -> None:
    """The old grader stopped the loop for 0.57 s on one 145-character completion (seconds on these)."""
    texts = [*WORST, *(w * (2 * MAX_CHARS // len(w)) for w in WORST)]  # and capped ones

    done = threading.Event()

    def grade_all() -> None:
        for text in texts * 3:
            grade("#### 18", text)
        done.set()

    async def main() -> float:
        gap = 0.0
        done.clear()
        last = time.perf_counter()  # before the worker starts: it may take the GIL at once
        worker = asyncio.get_running_loop().run_in_executor(None, grade_all)
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
        await worker
        return gap

    # A freeze is seconds on these texts; the bound is generous for a loaded 2-core machine (the
    # loop wakes every millisecond), and a second measurement lets a busy spell pass.
    gaps = [asyncio.run(main())]
    if gaps[0] >= 0.5:
        gaps.append(asyncio.run(main()))
    assert min(gaps) < 0.5, f"the event loop stopped for {min(gaps):.3f} s"


@given(st.text(max_size=200), st.integers(0, 3 * MAX_CHARS))
@settings(deadline=None, max_examples=30, derandomize=True)
def test_the_cap_keeps_the_tail_from_a_word_boundary(tail: str, junk: int) -> None:
    text = "12 " * (junk // 3) + tail
    kept, start = capped(text)
    assert kept == text[start:] and len(kept) <= MAX_CHARS
    if len(text) <= MAX_CHARS:
        assert start == 0
    else:  # "12 12 ...": a space within a few characters of the cut, never half a number
        assert text[start].isspace() and 0 <= start - (len(text) - MAX_CHARS) < 4


def test_the_final_answer_after_a_long_completion_is_read() -> None:
    junk = "Step: 3 + 4 = 7, and    so on. " * (3 * MAX_CHARS // 30)
    found = find_answer(junk + "The answer is \\boxed{18}.")
    assert found is not None and found.text == "18" and found.end == len(junk) + len("The answer is \\boxed{18}")
    assert grade("#### 18", junk + "So she makes 18 dollars.") == 1.0
