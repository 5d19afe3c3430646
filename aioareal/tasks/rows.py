"""Dataset rows for tasks from a local file (JSONL, JSON list, CSV, Parquet) or the hub, split into
training and held-out sets. Every row travels with where it came from ("train.jsonl:12"), so a bad
row is an error naming file and line. Without a separate held-out source the held-out set is carved
off a seeded shuffle.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from inspect import signature
from pathlib import Path
from typing import Any

from ..errors import DataError, UserError
from ..group import Example
from ..io import jsonl_lines, loads_bounded, parse_row

Located = list[tuple[str, dict[str, Any]]]  # (where the row is, e.g. "file.jsonl:12", row)
# (row, where it is, split name, index in that split) -> an example, or None to skip the row (counted)
MakeExample = Callable[[dict[str, Any], str, str, int], "Example | None"]
FILE_TYPES = (".jsonl", ".json", ".parquet", ".csv")


@dataclass
class RowSource:
    """Where a task's rows come from: a local file (`path`) or a hub dataset (`hub_name`)."""

    path: str | None = None
    hub_name: str | None = None
    hub_config: str | None = None
    split: str = "train"
    eval_split: str | None = None  # hub only: a held-out split instead of carving
    eval_path: str | None = None
    eval_size: int = 200  # rows carved off, or the cap on a separate held-out source (0 = all of it)
    seed: int = 1234
    skip_bad_rows: bool = False
    fields: tuple[str, ...] = ()  # fields every row needs, named in "no usable rows" errors
    skipped: int = field(default=0, init=False)  # malformed lines and rows the task refused

    def __post_init__(self) -> None:
        if self.eval_size < 0:
            raise UserError(f"data.eval_size must be >= 0, got {self.eval_size}")
        if self.path is None and self.hub_name is None:
            raise UserError("no rows: set data.path to a local file or data.hub_name to a hub dataset")

    def splits(self, make: MakeExample) -> tuple[list[Example], list[Example]]:
        self.skipped = 0
        if self.path is not None:
            train = self._examples(self.path, self.read_file(self.path), "train", make)
        else:
            train = self._examples(self.hub_source(self.split), self.read_hub(self.split), self.split, make)
        if self.eval_path is not None:
            held_out = self._examples(self.eval_path, self.read_file(self.eval_path), "eval", make)
        elif self.path is None and self.eval_split is not None:
            held_out = self._examples(self.hub_source(self.eval_split), self.read_hub(self.eval_split),
                                      self.eval_split, make)
        else:
            return self._carve(train)
        # A separate eval source: eval_size truncates it; 0 means all of it.
        return train, held_out[: self.eval_size or None]

    def _carve(self, rows: list[Example]) -> tuple[list[Example], list[Example]]:
        """Hold out the first eval_size rows of a seeded shuffle (0 holds out nothing)."""
        source = self.path or self.hub_source(self.split)
        if self.eval_size >= len(rows):
            raise UserError(f"data.eval_size={self.eval_size} would leave no training rows in {source} "
                            f"({len(rows)} rows); lower it or set data.eval_path")
        order = list(range(len(rows)))
        random.Random(self.seed).shuffle(order)
        held = set(order[: self.eval_size])
        return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in order[: self.eval_size]]

    def _examples(self, source: str, located: Located, split: str, make: MakeExample) -> list[Example]:
        examples = []
        for i, (where, row) in enumerate(located):
            example = make(row, where, split, i)
            if example is None:
                self.skipped += 1
            else:
                examples.append(example)
        if not examples:
            needs = " or ".join(f"'{f}'" for f in self.fields) or "the fields the task needs"
            raise DataError(f"{source}: no usable rows (all {len(located)} lack {needs})")
        return examples

    def read_file(self, path: str) -> Located:
        bad: list[int] = []
        located = read_file(path, self.skip_bad_rows, bad)
        self.skipped += len(bad)
        if not located:
            needs = " and ".join(f"'{f}'" for f in self.fields)
            raise DataError(f"{path}: empty file" + (f" (expected rows with {needs})" if needs else ""))
        return located

    def read_hub(self, split: str) -> Located:
        return read_hub(self.hub_name or "", self.hub_config, split)

    def hub_source(self, split: str) -> str:
        return f"{self.hub_name}[{split}]"


def field_value(row: dict[str, Any], name: str, where: str, skip_bad: bool = False, hint: str = "") -> Any:
    """The row's non-empty value of `name`; None when missing or empty and `skip_bad`, else a DataError.
    Bytes are text when they decode as UTF-8; NUL bytes and whitespace alone are empty."""
    value = row.get(name)
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{where}: field '{name}' holds bytes that are not UTF-8 text") from None
    if value is not None and str(value).strip().strip("\x00").strip():
        return value
    if skip_bad:
        return None
    problem = "missing" if value is None else "empty"
    raise DataError(f"{where}: {problem} field '{name}' (fields: {', '.join(map(str, row))}){hint}")


def read_file(path: str, skip_bad: bool = False, bad: list[int] | None = None) -> Located:
    """Rows of a .jsonl/.json/.parquet/.csv file, each with its location; `bad` collects skipped lines."""
    p = Path(path)
    if not p.is_file():
        what = ("a directory" if p.is_dir() else "not a regular file (a pipe or a device)" if p.exists()
                else "no such file")
        raise DataError(f"{path}: {what}; expected a data file ({', '.join(FILE_TYPES)})")
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        return _read_jsonl(p, skip_bad, [] if bad is None else bad)
    if suffix == ".json":
        return _read_json(p)
    if suffix in (".parquet", ".csv"):
        return _read_table(p)
    raise DataError(f"{path}: unsupported file type '{suffix}' (expected {', '.join(FILE_TYPES)})")


def read_hub(name: str, config: str | None, split: str) -> Located:
    """Rows of one split of a `datasets` hub dataset (imported here: only hub tasks pay for it)."""
    try:
        from datasets import load_dataset

        # datasets 2.x runs a dataset's own loading script unless told not to (4.x has none).
        no_scripts = {"trust_remote_code": False} if "trust_remote_code" in signature(load_dataset).parameters else {}
        ds = load_dataset(name, config, split=split, **no_scripts)
        rows = [dict(r) for r in ds]
    except Exception as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        named = f" (config '{config}', split '{split}')" if config else f" (split '{split}')"
        raise UserError(f"could not load '{name}'{named} from the hub: {reason}; set data.path to a local "
                        f"{'/'.join(FILE_TYPES)} file instead") from None
    return [(f"{name}[{split}] row {i}", row) for i, row in enumerate(rows, 1)]


def _read_jsonl(p: Path, skip_bad: bool, bad: list[int]) -> Located:
    located = []
    for n, line in jsonl_lines(p):
        try:
            located.append((f"{p}:{n}", parse_row(line)))
        except ValueError as e:
            if not skip_bad:
                raise DataError(f"{p}:{n}: malformed JSON line ({e})") from None
            bad.append(n)
    return located


def _read_json(p: Path) -> Located:
    try:
        rows = loads_bounded(p.read_text(encoding="utf-8"))  # undecodable bytes are a ValueError too
    except RecursionError:
        raise DataError(f"{p}: malformed JSON (nested too deeply)") from None
    except ValueError as e:
        raise DataError(f"{p}: malformed JSON ({e})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DataError(f"{p}: expected a JSON list of objects")
    return [(f"{p}: row {i}", row) for i, row in enumerate(rows, 1)]


def _read_table(p: Path) -> Located:
    import pandas as pd

    try:
        # CSV: only an empty cell is missing; NA, None, null are answers too (a yes/no/NA task).
        frame = pd.read_parquet(p) if p.suffix.lower() == ".parquet" else \
            pd.read_csv(p, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        return []
    except Exception as e:
        raise DataError(f"{p}: could not read ({e})") from None
    csv = p.suffix.lower() == ".csv"
    first_line = 2 if csv else 1  # CSV: line 1 is the header
    where = "{}:{}" if csv else "{}: row {}"
    return [(where.format(p, i + first_line), _clean(row)) for i, row in enumerate(frame.to_dict("records"))]


def _clean(row: dict[Any, Any]) -> dict[str, Any]:
    """Plain Python values from pandas' numpy ones; NaN (pandas' missing cell) is a missing field."""
    import numpy as np

    plain = {str(k): v.tolist() if isinstance(v, (np.generic, np.ndarray)) else v for k, v in row.items()}
    return {k: v for k, v in plain.items() if not (isinstance(v, float) and v != v)}


class RowTask:
    """A task whose examples come from a `RowSource`; subclasses say how a row becomes one (`_example`)."""

    source: RowSource
    _splits: tuple[list[Example], list[Example]] | None = None

    @property
    def skipped(self) -> int:
        """Rows dropped by skip_bad_rows (malformed lines and missing fields)."""
        return self.source.skipped

    def splits(self) -> tuple[list[Example], list[Example]]:
        if self._splits is None:
            self._splits = self.source.splits(self._example)
        return self._splits

    def _example(self, row: dict[str, Any], where: str, split: str, index: int) -> Example | None:
        raise NotImplementedError
