"""Where the GSM8K tests read their data: the 100 + 100 item slice committed under tests/data/gsm8k
(make_slice.py there says how it was chosen), and the full set, opt-in: $AIOAREAL_GSM8K_DIR, or
../shared/data/gsm8k beside the clone, holding test.jsonl (conftest.py's `gsm8k_test` fixture runs
each check on both, the full set marked slow)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SLICE = REPO / "tests" / "data" / "gsm8k"
FULL_TEST_ITEMS = 1319


@dataclass(frozen=True)
class GSM8KTest:
    """A GSM8K test file and its rows; `full`: the whole 1,319-item set rather than the slice."""

    path: Path
    rows: list[dict]
    full: bool


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def full_dir() -> Path | None:
    """The full set's folder when there is one: $AIOAREAL_GSM8K_DIR (an error if it holds no
    test.jsonl), else ../shared/data/gsm8k beside the clone, else None."""
    named = os.environ.get("AIOAREAL_GSM8K_DIR")
    if named:
        if not (Path(named) / "test.jsonl").is_file():
            pytest.fail(f"AIOAREAL_GSM8K_DIR={named}: no test.jsonl there")
        return Path(named)
    beside = REPO.parent / "shared" / "data" / "gsm8k"
    return beside if (beside / "test.jsonl").is_file() else None


def gsm8k_file(which: str) -> GSM8KTest:
    """'slice' or 'full' (skipped where the full set is absent)."""
    folder = SLICE if which == "slice" else full_dir()
    if folder is None:
        pytest.skip("the full GSM8K set is opt-in: set AIOAREAL_GSM8K_DIR to a folder holding test.jsonl")
    return GSM8KTest(folder / "test.jsonl", read_rows(folder / "test.jsonl"), full=which == "full")
