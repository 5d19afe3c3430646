"""Which answer is final when a completion states several, scored as a careful grader scores them: part
of the grading cases (`bench.grading_cases.CASES`, each a test in `tests/test_grading.py`).

A careful grader reads the last answer the completion commits to: the final box, unless prose after it
retracts it with a new answer; a check, note or sign-off after the answer changes nothing; boxes
offered as alternatives, an empty or unfinished final box, and a completion cut off before it states
an answer commit to nothing.
"""
from __future__ import annotations

EGGS = ("Janet's ducks lay 16 eggs per day. She eats 3 for breakfast and uses 4 for muffins, so "
        "16 - 3 - 4 = 9 eggs are left. She sells each egg for $2, so she makes 9 \\times 2 = 18 dollars.\n\n")
WINDOWS = "Let's count:\n18. Each house has 2 windows.\n19. Each window is connected to each other window.\n"

FINAL_ANSWER_CASES: list[tuple[str, str, str, float]] = [
    # --- what follows the final statement: checks, notes, asides, sign-offs --------------------
    ("trailers", "18", EGGS + "So Janet makes $18 a day.\n\nCheck: 18 / 2 = 9 eggs sold, 9 + 3 + 4 = 16 laid.", 1.0),
    ("trailers", "16", EGGS + "So Janet makes $18 a day.\n\nCheck: 18 / 2 = 9 eggs sold, 9 + 3 + 4 = 16 laid.", 0.0),
    ("trailers", "18", "So Janet makes $18 every day. (She keeps 3 + 4 = 7 of her 16 eggs.)", 1.0),
    ("trailers", "16", "So Janet makes $18 every day. (She keeps 3 + 4 = 7 of her 16 eggs.)", 0.0),
    ("trailers", "16", "So Janet makes $18 a day.\n\n**Verification:**\n- 9 × 2 = 18 ✓\n- 9 + 3 + 4 = 16 ✓", 0.0),
    ("trailers", "16", "So Janet makes $18 a day.\nNote: her ducks lay 16 eggs a day.", 0.0),
    ("trailers", "18", "So Janet makes $18 a day.\nNote: her ducks lay 16 eggs a day.", 1.0),
    ("trailers", "16", "So Janet makes $18 a day.\nLet's double-check: 9 eggs sold and 9 + 3 + 4 = 16.", 0.0),
    ("trailers", "16", "So she makes $18 a day. This makes sense because 9 + 3 + 4 = 16.", 0.0),
    ("trailers", "2", "So she makes $18 a day.\n\nI hope it helps. Let me know if you need problem 2 too!", 0.0),
    ("trailers", "18", "She makes $20 a day.\nCheck: 9 × 2 = 18, not 20. So she makes $18 a day.", 1.0),
    ("trailers", "20", "She makes $20 a day.\nCheck: 9 × 2 = 18, not 20. So she makes $18 a day.", 0.0),
    ("trailers", "16", EGGS + "So Janet makes $18 a day.\n\n### Verification\n9 + 3 + 4 = 16 eggs", 0.0),
    ("trailers", "18", EGGS + "So Janet makes $18 a day.\n\n### Verification\n9 + 3 + 4 = 16 eggs", 1.0),
    # --- which answer is final: the last committed one ------------------------------------------
    ("final", "18", "She has \\boxed{9} eggs left, so she makes 9 × 2 = \\boxed{18} dollars.", 1.0),
    ("final", "9", "She has \\boxed{9} eggs left, so she makes 9 × 2 = \\boxed{18} dollars.", 0.0),
    ("final", "18", "First I thought \\boxed{20}, but rechecking: 16 - 3 - 4 = 9, 9 × 2 = 18, so \\boxed{18}.", 1.0),
    ("final", "20", "First I thought \\boxed{20}, but rechecking: 16 - 3 - 4 = 9, 9 × 2 = 18, so \\boxed{18}.", 0.0),
    ("final", "24", "She has \\boxed{24}.\n\nWait, I forgot the 2 she gives away. The answer is 26.", 0.0),
    ("final", "26", "She has \\boxed{24}.\n\nWait, I forgot the 2 she gives away. The answer is 26.", 1.0),
    ("final", "26", "She has \\boxed{24}. Wait, I forgot the 2 she gives away, so she has 26.", 1.0),
    ("final", "18", "\\boxed{16}\n\nOops, I forgot the 7 she keeps: she makes \\boxed{18}.", 1.0),
    ("final", "20", "The answer is 20. Wait, she bakes 4 into muffins: 9 × 2 = 18, so she makes 18.", 0.0),
    ("final", "18", "The answer is 20. Wait, she bakes 4 into muffins: 9 × 2 = 18, so she makes 18.", 1.0),
    ("final", "18", "\\boxed{18}\n\nCheck: 9 + 3 + 4 = 16 eggs, and 9 × 2 = 18 dollars. ✓", 1.0),
    ("final", "16", "\\boxed{18}. Wait, let me double-check: 9 × 2 = 18 and 9 + 3 + 4 = 16. Correct.", 0.0),
    ("final", "18", "\\boxed{18}. Wait, let me double-check: 9 × 2 = 18 and 9 + 3 + 4 = 16. Correct.", 1.0),
    ("final", "19", "The answer is either \\boxed{18} or \\boxed{19}.", 0.0),
    ("final", "19", "\\boxed{18}, \\boxed{19}", 0.0),
    ("final", "18", "So she makes \\boxed{18} or maybe 19 dollars.", 0.0),
    ("final", "18", "She makes \\boxed{18}.\n\nThe final answer is \\boxed{}.", 0.0),
    ("final", "18", "So she makes 9 × 2 = 18 dollars, and the answer is \\boxed{1", 0.0),
    ("final", "18", "So she makes \\boxed{18}. The final answer is \\boxed{18", 0.0),
    ("final", "18", "\\boxed{18}\n\nWait, she also had 2 more eggs? No, that's it.", 1.0),
    ("final", "2", "\\boxed{18}\n\nWait, she also had 2 more eggs? No, that's it.", 0.0),
    # --- a question states nothing ----------------------------------------------------------------
    ("questions", "18", "So she makes 18 dollars. Is that 9 × 2?", 1.0),
    ("questions", "2", "So she makes 18 dollars. Is that 9 × 2?", 0.0),
    ("questions", "18", "Does she make 18 dollars a day?", 0.0),
    # --- cut off at the token limit, and numbered lists ------------------------------------------
    ("unfinished", "20", WINDOWS + "20. Each window is connected", 0.0),
    ("unfinished", "2", "He looks at 2 necklaces, and his sister has chosen 2.\nThe next thing that happens is", 0.0),
    ("unfinished", "18", EGGS + "Now, to find her weekly earnings, we multiply", 0.0),
    ("unfinished", "159", "To add 98 and 61, we line up the digits.\n\nSo, 98 + 61 = 159 is", 1.0),
    ("unfinished", "18", EGGS + "So she makes $18 a day", 1.0),
    ("lists", "18", "1. Eggs left: 16 - 3 - 4 = 9\n2. Money: 9 × 2 = 18\n3. So she makes eighteen dollars.", 1.0),
    ("lists", "3", "1. Eggs left: 16 - 3 - 4 = 9\n2. Money: 9 × 2 = 18\n3. So she makes eighteen dollars.", 0.0),
    ("lists", "2", WINDOWS + "20. Each window is connected to each other window.", 0.0),
]
