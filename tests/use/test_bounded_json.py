"""JSON read with a depth bound (docs/reliability.md#bounded-readers): a deeply nested row in a data
file, samples.jsonl, metrics.jsonl on resume or a row's `tools` column is one line naming file and
line (or skipped and counted), never a RecursionError; anything within the bound reads as json.loads
reads it."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal.errors import DataError, UserError
from aioareal.io import MAX_JSON_DEPTH, iter_jsonl, loads_bounded, repair_jsonl
from aioareal.tasks.rows import read_file
from aioareal.use.samples import read_samples

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_ROW = '{"question": "1+1", "answer": "2", "x": ' + "{\"a\": " * 50_000 + "1" + "}" * 50_000 + "}"


def test_deep_jsonl_rows_are_one_line_naming_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "1+1", "answer": "2"}\n\n' + DEEP_ROW + "\n")
    with pytest.raises(DataError) as e:
        read_file(str(path))
    assert str(e.value) == f"{path}:3: malformed JSON line (nested deeper than {MAX_JSON_DEPTH} levels)"
    bad: list[int] = []
    assert [row["answer"] for _, row in read_file(str(path), skip_bad=True, bad=bad)] == ["2"] and bad == [3]


def test_a_deep_json_file_is_one_line(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(DEEP)
    with pytest.raises(DataError, match=f"{path}: malformed JSON \\(nested deeper than {MAX_JSON_DEPTH} levels\\)"):
        read_file(str(path))


def test_deep_lines_in_a_runs_files_never_raise_recursion_errors(tmp_path):
    (tmp_path / "samples.jsonl").write_text(DEEP + "\n")
    with pytest.raises(UserError, match="samples.jsonl:1: malformed JSON line \\(nested deeper"):
        read_samples(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n' + DEEP_ROW + "\n")
    assert repair_jsonl(metrics) == 1  # resume's repair drops it as it drops a torn line
    assert list(iter_jsonl(metrics)) == [{"step": 1}]


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"text": "[" * 5000 + "{" * 5000, "quote": '\\"[[[' * 300})
    assert loads_bounded(text) == json.loads(text)
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads_bounded(nested) == json.loads(nested)
    with pytest.raises(ValueError):
        loads_bounded("[" + nested + "]")


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet="[]{}\\\"ab ", max_size=12),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                        max_size=3), max_leaves=300)


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_values_within_the_bound_read_as_json_loads_reads_them(value):
    text = json.dumps(value)
    if depth(value) <= MAX_JSON_DEPTH:
        assert loads_bounded(text) == json.loads(text)
    else:
        with pytest.raises(ValueError):
            loads_bounded(text)


def depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0
