"""Real completions labelled by hand: the second agreement table of `bench reward`.

`real_completions.jsonl` holds SmolLM2-135M-Instruct's own outputs (the Q4_1 GGUF, dequantized to
float32 by transformers; chat template on) on GSM8K test questions (the question + " Please put your
final answer within \\boxed{}.", up to 256 new tokens) and on 2-digit sums ("What is 23 + 45? Put the
final answer in \\boxed{}.", up to 64 new tokens), each greedy and sampled at temperature 1.0. Each
row: `id`, `source` (gsm8k | sums), `decoding` (greedy | sample), `split`, `prompt`, `answer` (the
gold number), `completion`, `label` (1 correct, 0 not).

Labelling rule (applied by reading each completion, before comparing with any grader): 1 when the
final answer the completion commits to equals the gold value, however it is written (units, words,
formatting); the final answer is the last one it commits to: its final box unless prose after it
retracts it with a new answer, else its last "the answer is ..." statement, else the result its final
statement concludes with. The reasoning does not matter (a right answer after wrong steps is 1: an
outcome reward). 0 when the final answer differs, hedges between values, or does not exist: nothing
committed to, an empty or unfinished final box, a completion cut off (at the token limit) before it
states a result, a gold number that only appears as an intermediate step or a list item's number.

Splits: `dev` (the first 160, which the grader was checked and fixed against: its two false passes,
a completion cut off mid-sentence and a numbered list's item number, became grading cases), and
`held-out` (generated and labelled after the grader was frozen; never used to change it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

PATH = Path(__file__).with_name("real_completions.jsonl")


def load(split: str | None = None) -> list[dict[str, Any]]:
    """The labelled rows (one split, or all), as `run_completions.read_rows` reads them."""
    from .run_completions import read_rows

    rows = read_rows(PATH)
    return [r for r in rows if split is None or r["split"] == split]
