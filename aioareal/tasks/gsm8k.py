"""GSM8K: grade-school math word problems, scored by final-answer equivalence.

Rows come from a local file (JSONL, JSON list, Parquet, CSV) or the Hugging Face hub. The prompt is
the question plus DESIGN's common instruction to box the answer (the chat template is applied by
the renderer); the reference is the whole gold solution, whose `#### N` line the verifier extracts.
Without a separate eval file the held-out split is carved off a seeded shuffle of the rows.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from ..errors import DataError, UserError
from ..io import iter_jsonl
from .base import Example
from .verify import math_equal

INSTRUCTION = "Please put your final answer within \\boxed{}."
Located = list[tuple[str, dict[str, Any]]]  # (where the row is, e.g. "file.jsonl:12", row)


class GSM8KTask:
    name = "gsm8k"
    chat = True

    def __init__(self, path: str | None = None, hub_name: str = "openai/gsm8k", hub_config: str = "main",
                 split: str = "train", eval_split: str | None = "test", eval_path: str | None = None,
                 eval_size: int = 200, skip_bad_rows: bool = False, seed: int = 1234,
                 question_field: str = "question", answer_field: str = "answer", timeout_s: float = 5.0) -> None:
        if eval_size < 0:
            raise UserError(f"data.eval_size must be >= 0, got {eval_size}")
        self.path, self.eval_path, self.eval_size, self.seed = path, eval_path, eval_size, seed
        self.hub_name, self.hub_config, self.split, self.eval_split = hub_name, hub_config, split, eval_split
        self.skip_bad_rows, self.timeout_s = skip_bad_rows, timeout_s
        self.question_field, self.answer_field = question_field, answer_field
        self.skipped = 0  # rows dropped by skip_bad_rows (malformed lines and missing fields)
        self._splits: tuple[list[Example], list[Example]] | None = None

    def splits(self) -> tuple[list[Example], list[Example]]:
        if self._splits is None:
            self._splits = self._load_splits()
        return self._splits

    def score(self, completion: str, example: Example) -> float:
        return math_equal(example.answer, completion, self.timeout_s)

    def _load_splits(self) -> tuple[list[Example], list[Example]]:
        self.skipped = 0
        if self.path is not None:
            train = self._examples(self.path, self._read_file(self.path), "train")
        else:
            train = self._examples(self._hub_source(self.split), self._read_hub(self.split), self.split)
        if self.eval_path is not None:
            held_out = self._examples(self.eval_path, self._read_file(self.eval_path), "eval")
        elif self.path is None and self.eval_split is not None:
            held_out = self._examples(self._hub_source(self.eval_split), self._read_hub(self.eval_split),
                                      self.eval_split)
        else:
            return self._carve(train)
        # A separate eval source: eval_size truncates it; 0 means all of it.
        return train, held_out[: self.eval_size or None]

    def _carve(self, rows: list[Example]) -> tuple[list[Example], list[Example]]:
        """Hold out the first eval_size rows of a seeded shuffle (0 holds out nothing)."""
        source = self.path or self._hub_source(self.split)
        if self.eval_size >= len(rows):
            raise UserError(f"data.eval_size={self.eval_size} would leave no training rows in {source} "
                            f"({len(rows)} rows); lower it or set data.eval_path")
        order = list(range(len(rows)))
        random.Random(self.seed).shuffle(order)
        held = set(order[: self.eval_size])
        return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in order[: self.eval_size]]

    def _examples(self, source: str, located: Located, split: str) -> list[Example]:
        examples = []
        for i, (where, row) in enumerate(located):
            question, answer = self._field(row, self.question_field, where), self._field(row, self.answer_field, where)
            if question is None or answer is None:
                self.skipped += 1
                continue
            examples.append(Example(uid=f"gsm8k-{split}-{i}", prompt=f"{question}\n{INSTRUCTION}",
                                    answer=answer, row=row))
        if not examples:
            raise DataError(f"{source}: no usable rows (all {len(located)} lack '{self.question_field}' "
                            f"or '{self.answer_field}')")
        return examples

    def _field(self, row: dict[str, Any], name: str, where: str) -> str | None:
        value = row.get(name)
        if value is not None and str(value).strip():
            return str(value).strip()
        if self.skip_bad_rows:
            return None
        problem = "missing" if value is None else "empty"
        raise DataError(f"{where}: {problem} field '{name}' (fields: {', '.join(map(str, row))})")

    def _read_file(self, path: str) -> Located:
        p = Path(path)
        if not p.is_file():
            raise DataError(f"{path}: no such file")
        suffix = p.suffix.lower()
        if suffix == ".jsonl":
            located = self._read_jsonl(p)
        elif suffix == ".json":
            located = _read_json(p)
        elif suffix in (".parquet", ".csv"):
            located = _read_table(p)
        else:
            raise DataError(f"{path}: unsupported file type '{suffix}' (expected .jsonl, .json, .parquet or .csv)")
        if not located:
            raise DataError(f"{path}: empty file (expected rows with '{self.question_field}' and "
                            f"'{self.answer_field}')")
        return located

    def _read_jsonl(self, p: Path) -> Located:
        bad: list[int] = []
        rows = list(iter_jsonl(p, skip_bad=self.skip_bad_rows, bad=bad))
        self.skipped += len(bad)
        # iter_jsonl skips blank and (optionally) malformed lines: recover each row's line number.
        with p.open(encoding="utf-8") as f:
            skip = set(bad)
            lines = [n for n, line in enumerate(f, 1) if line.strip() and n not in skip]
        return [(f"{p}:{n}", row) for n, row in zip(lines, rows)]

    def _read_hub(self, split: str) -> Located:
        try:
            from datasets import load_dataset

            ds = load_dataset(self.hub_name, self.hub_config, split=split)
            rows = [dict(r) for r in ds]
        except Exception as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"could not load '{self.hub_name}' (config '{self.hub_config}', split '{split}') "
                            f"from the hub: {reason}; set data.path to a local .jsonl/.json/.parquet/.csv "
                            f"file instead") from None
        return [(f"{self._hub_source(split)} row {i}", row) for i, row in enumerate(rows, 1)]

    def _hub_source(self, split: str) -> str:
        return f"{self.hub_name}[{split}]"


def _read_json(p: Path) -> Located:
    try:
        rows = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise DataError(f"{p}: malformed JSON ({e})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{p}: expected a JSON list of objects")
    return [(f"{p}: row {i}", row) for i, row in enumerate(rows, 1)]


def _read_table(p: Path) -> Located:
    import pandas as pd

    try:
        frame = pd.read_parquet(p) if p.suffix.lower() == ".parquet" else pd.read_csv(p)
    except pd.errors.EmptyDataError:
        return []
    except Exception as e:
        raise DataError(f"{p}: could not read ({e})") from None
    first_line = 2 if p.suffix.lower() == ".csv" else 1  # CSV: line 1 is the header
    records = frame.to_dict("records")
    where = "{}:{}" if p.suffix.lower() == ".csv" else "{}: row {}"
    return [(where.format(p, i + first_line), _clean(row)) for i, row in enumerate(records)]


def _clean(row: dict[Any, Any]) -> dict[str, Any]:
    """pandas fills missing cells with NaN; treat them as missing fields."""
    return {str(k): v for k, v in row.items() if not (isinstance(v, float) and v != v)}
