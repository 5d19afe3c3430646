"""Data handed to `aioareal.train` as objects, written where the run keeps it: RUN_DIR/data/train.jsonl
(and eval.jsonl), one JSON row a line, read back by the file task as any JSONL. Values become what
JSON holds (numpy scalars and arrays as numbers and lists, pandas' NaN as null); anything else is
an error naming the row and column."""
from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..io import atomic_write_text

DATA_FILES = {"train": "train.jsonl", "eval": "eval.jsonl"}


def data_file(data: Any, run_dir: Path, split: str, written: list[Path]) -> str:
    """A file path as it is; rows (a Dataset, a DataFrame, dicts) written to RUN_DIR/data/SPLIT.jsonl
    (appended to `written`)."""
    if isinstance(data, (str, Path)):
        return str(data)
    path = run_dir / "data" / DATA_FILES[split]
    what = "train_dataset" if split == "train" else "eval_dataset"
    rows = enumerate(rows_of(data, what))
    lines = [json.dumps(plain_row(row, f"{what} row {i}"), ensure_ascii=False) for i, row in rows]
    if not lines:
        raise DataError(f"{what}: no rows")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")
    written.append(path)
    return str(path)


def remove_written(paths: list[Path]) -> None:
    """The files data_file wrote, then their folder and the run directory above it where left empty."""
    for path in paths:
        path.unlink(missing_ok=True)
    folders = {p.parent for p in paths} | {p.parent.parent for p in paths}
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):  # data/ before the run directory
        with contextlib.suppress(OSError):
            folder.rmdir()


def rows_of(data: Any, what: str) -> Iterable[Any]:
    if hasattr(data, "to_list") and hasattr(data, "column_names"):  # datasets.Dataset
        return data.to_list()
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas.DataFrame
        return data.to_dict(orient="records")
    if isinstance(data, (list, tuple)):
        return data
    raise DataError(f"{what}: a {type(data).__name__}, expected a datasets.Dataset, a pandas DataFrame, a list of "
                    "dicts or a file path (JSONL, JSON, CSV, Parquet)")


def plain_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataError(f"{where}: a {type(row).__name__}, expected a dict of columns")
    return {str(k): _plain(v, f"{where}, column '{k}'") for k, v in row.items()}


def _plain(value: Any, where: str) -> Any:
    """`value` as JSON holds it: numpy scalars and arrays as numbers and lists, NaN (pandas' missing) as null."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (bytes, bytearray)):  # numpy scalars and arrays
        return _plain(value.tolist(), where)
    raise DataError(f"{where}: a {type(value).__name__} value, expected text, a number, a list or a dict")
