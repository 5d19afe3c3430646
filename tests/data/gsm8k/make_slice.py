"""Write this folder's GSM8K slice from the full data set (github.com/openai/grade-school-math, MIT):

    python tests/data/gsm8k/make_slice.py /path/to/gsm8k   # the folder with test.jsonl and train.jsonl

100 items of each split, the lines copied byte for byte in their original order. Chosen so the
slice holds what the tests name and the answers that are hard to read: the first item of each
split (tests/grading/test_gsm8k.py reads test item 0), test items 611 and 796 (a relative tolerance would
accept 1,450,001 for 611's 1,450,000), every answer written with a thousands separator or a minus
sign (up to 20 of each per split), then items drawn with a fixed seed up to 100."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SIZE = 100
NAMED = {"test": [0, 611, 796], "train": [0]}
PER_KIND = 20


def chosen(lines: list[str], named: list[int], seed: int) -> list[int]:
    finals = [json.loads(line)["answer"].split("####")[-1].strip() for line in lines]
    picked = set(named)
    for mark in (",", "-"):
        picked |= set([i for i, f in enumerate(finals) if mark in f][:PER_KIND])
    rest = [i for i in range(len(lines)) if i not in picked]
    picked |= set(random.Random(seed).sample(rest, SIZE - len(picked)))
    return sorted(picked)


def main(source: Path, target: Path) -> None:
    for seed, split in enumerate(("test", "train")):
        lines = (source / f"{split}.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
        (target / f"{split}.jsonl").write_text("".join(lines[i] for i in chosen(lines, NAMED[split], seed)),
                                               encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parent)
