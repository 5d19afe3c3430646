"""`report` and `plot` read samples.jsonl and metrics.jsonl line by line and keep only numbers
(issue 49: `report` on a 197 MB samples file took 4.3x its size in memory): a samples file of long
completions costs what its one drawn column does, not what its text does."""
from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

from aioareal.lab.experiments.load import load_runs, read_frame

ROWS, TEXT = 4000, 4000  # about 16 MB of completions


def write_run(d: Path) -> int:
    d.mkdir()
    (d / "config.yaml").write_text("model:\n  name: tiny\nalgo:\n  batch_groups: 2\n  group_size: 4\n")
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": float(s), "note": "x" * 100}) + "\n"
                                             for s in range(5)))
    with (d / "samples.jsonl").open("w") as f:
        for i in range(ROWS):
            row = {"step": 1 + i % 4, "completion": "y" * TEXT, "prompt": "z" * 200, "reward": 1.0}
            if i % 5:  # every fifth row has no staleness, every seventh an odd one
                row["staleness"] = "two" if i % 7 == 0 else i % 3
            f.write(json.dumps(row) + "\n")
    return (d / "samples.jsonl").stat().st_size


def test_a_large_samples_file_is_read_in_bounded_memory(tmp_path: Path) -> None:
    size = write_run(tmp_path / "run")
    tracemalloc.start()
    try:
        (run,) = load_runs(tmp_path / "run")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 20, f"peak {peak / 1e6:.1f} MB reading a {size / 1e6:.1f} MB samples file"
    assert list(run.samples.columns) == ["staleness"] and len(run.samples) == ROWS
    expected = [math.nan if i % 5 == 0 or i % 7 == 0 else i % 3 for i in range(ROWS)]
    assert [v if not math.isnan(v) else "nan" for v in run.samples["staleness"]] == \
        [v if not math.isnan(v) else "nan" for v in expected]
    assert list(run.metrics["step"]) == [0, 1, 2, 3, 4] and run.metrics["note"].isna().all()


def test_numbers_only_and_columns_padded(tmp_path: Path) -> None:
    file = tmp_path / "m.jsonl"
    file.write_text('{"step": 2, "a": "3"}\n{"step": 1, "b": true, "a": 10e400}\n'
                    '{"step": null, "a": [1]}\n{"step": 3, "a": 123456789012345678901234567890123456789}\n')
    df = read_frame(file)
    assert df["step"].tolist()[:2] == [2.0, 1.0] and math.isnan(df["step"][2])
    assert math.isnan(df["a"][0]) and df["a"][1] == math.inf and math.isnan(df["a"][2]) and df["a"][3] > 1e38
    assert df["b"].isna().all()  # true is no number
    assert read_frame(file, sort=True)["step"].tolist() == [1.0, 2.0, 3.0]
