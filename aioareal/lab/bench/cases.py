"""The data `bench reward` measures agreement on, read from a folder: `--cases DIR`, else the
repository's tests/data/grading (a clone or an editable install; its README.md describes the files).
The wheel ships no data (docs/architecture.md#layout): an installed copy finds no folder, and `bench
reward` skips the agreement figures.

- `grading_cases.jsonl`, `final_answer_cases.jsonl`: written cases, one JSON object a line with
  `class`, `gold`, `completion` and `score` (1.0 or 0.0, what a careful grader gives).
- `real_completions.jsonl`: SmolLM2-135M-Instruct's own completions labelled by hand (`label` 1 or 0),
  read as `bench reward --from` reads a run's samples.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from ...errors import UserError
from ...io import row_at

REPOSITORY_DIR = Path(__file__).resolve().parents[3] / "tests" / "data" / "grading"
CASE_FILES = ("grading_cases.jsonl", "final_answer_cases.jsonl")
REAL_FILE = "real_completions.jsonl"


class Case(NamedTuple):
    kind: str  # the case's class (`class` in the file): which rule of the grader it checks
    gold: str
    completion: str
    score: float  # what a careful grader gives: 1.0 or 0.0


def cases_dir(given: str | None) -> Path | None:
    """The folder to read: `given` (an error naming it when it lacks a file), else the repository's
    when this copy of the package sits in one, else None (an installed wheel)."""
    if given is None:
        return REPOSITORY_DIR if REPOSITORY_DIR.is_dir() else None
    folder = Path(given)
    missing = [name for name in (*CASE_FILES, REAL_FILE) if not (folder / name).is_file()]
    if missing:
        raise UserError(f"--cases {given}: expected a folder with {', '.join(missing)} (as in tests/data/grading)")
    return folder


def load_cases(folder: Path) -> list[Case]:
    """The written cases of every case file, in file order."""
    return [case for name in CASE_FILES for case in _read_cases(folder / name)]


def load_real(folder: Path, split: str | None = None) -> list[dict[str, Any]]:
    """The hand-labelled completions (one split, dev or held-out, or all)."""
    from .run_completions import read_rows

    rows = read_rows(folder / REAL_FILE)
    return [r for r in rows if split is None or r["split"] == split]


def _read_cases(file: Path) -> list[Case]:
    cases = []
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                cases.append(_case(line, f"{file}:{number}"))
    return cases


def _case(line: str, where: str) -> Case:
    row = row_at(line, where)
    for field in ("class", "gold", "completion"):
        if not isinstance(row.get(field), str):
            raise UserError(f"{where}: expected a text field {field!r}")
    if row.get("score") not in (0, 1) or isinstance(row.get("score"), bool):
        raise UserError(f"{where}: 'score' must be 1.0 (credit) or 0.0, not {row.get('score')!r}")
    return Case(row["class"], row["gold"], row["completion"], float(row["score"]))
