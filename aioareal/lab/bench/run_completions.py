"""`bench reward --from RUN`: grade the completions a run actually produced (its `samples.jsonl`,
or any JSONL with a completion's text and its gold answer per row) with `gsm8k_reward`, math-verify
alone and the regex baselines, and print where they disagree, so that grading is checked on what
models write, not only on written cases. Rows with a hand `label` (1 or 0, as in the repository's
tests/data/grading/real_completions.jsonl) are also scored against it: agreement, false passes and
false fails.

Graders run in this process one completion at a time (math-verify alone with its own signal
timeouts, so from the main thread); ours runs its rare symbolic checks in the worker pool.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import UserError
from ...io import row_at

SAMPLES_FILE = "samples.jsonl"
_SHOWN = 100  # characters of a completion's end shown beside a disagreement


def read_rows(path: str | Path, completion_field: str = "completion",
              answer_field: str = "answer") -> list[dict[str, Any]]:
    """The rows of a run's samples.jsonl (a run directory works too), each with the completion's text
    and its gold answer; a row without them is an error that names the file and line."""
    file = Path(path)
    if file.is_dir():
        file = file / SAMPLES_FILE
    if not file.is_file():
        raise UserError(f"--from {path}: no such file (give a run directory or its {SAMPLES_FILE})")
    rows = []
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                rows.append(_row(line, f"{file}:{number}", completion_field, answer_field))
    if not rows:
        raise UserError(f"{file}: no rows to grade (the run trained no step yet?)")
    return rows


def _row(line: str, where: str, completion_field: str, answer_field: str) -> dict[str, Any]:
    row = row_at(line, where)
    for field, what in ((completion_field, "the completion's text"), (answer_field, "the gold answer")):
        if not isinstance(row.get(field), str):
            raise UserError(f"{where}: no text field {field!r} ({what}); this run's samples.jsonl does not record "
                            f"completion text, so it cannot be graded (see --completion-field / --answer-field)")
    if "label" in row and row["label"] not in (0, 1):
        raise UserError(f"{where}: 'label' must be 1 (correct) or 0, not {row['label']!r}")
    return {**row, "completion": row[completion_field], "answer": row[answer_field], "where": where}


def scores(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each grader's scores of the rows: ours (`gsm8k_reward`), math-verify alone, strict and flexible regex."""
    from ...tasks.gsm8k import gsm8k_reward
    from .baselines import BASELINES

    golds, texts = [r["answer"] for r in rows], [r["completion"] for r in rows]
    out = {"ours": gsm8k_reward(texts, golds, timeout_s=10.0)}
    out.update({name: [_safe(fn, g, t) for g, t in zip(golds, texts)] for name, fn in BASELINES.items()})
    return out


def summary(rows: list[dict[str, Any]], graded: dict[str, list[float]], prefix: str = "") -> dict[str, Any]:
    """Pass rates, how often each baseline disagrees with ours, and against hand labels (if every row
    has one) agreement, false passes and false fails."""
    n = len(rows)
    out: dict[str, Any] = {f"{prefix}rows": n}
    labels = [r.get("label") for r in rows]
    for name, got in graded.items():
        out[f"{prefix}pass_{name}"] = round(sum(got) / n, 3)
        if name != "ours":
            out[f"{prefix}differ_{name}"] = sum(g != o for g, o in zip(got, graded["ours"]))
        if None not in labels:
            out[f"{prefix}agree_{name}"] = round(sum(g == e for g, e in zip(got, labels)) / n, 3)
            out[f"{prefix}false_pass_{name}"] = sum(g == 1.0 and e == 0 for g, e in zip(got, labels))
            out[f"{prefix}false_fail_{name}"] = sum(g == 0.0 and e == 1 for g, e in zip(got, labels))
    return out


def disagreements(rows: list[dict[str, Any]], graded: dict[str, list[float]]) -> list[str]:
    """One line per row where the graders (or a hand label) do not all agree."""
    lines = []
    for i, row in enumerate(rows):
        verdicts = {name: int(got[i]) for name, got in graded.items()}
        if "label" in row:
            verdicts = {"label": row["label"], **verdicts}
        if len(set(verdicts.values())) > 1:
            tail = row["completion"][-_SHOWN:].replace("\n", "\\n")
            shown = " ".join(f"{k}={v}" for k, v in verdicts.items())
            lines.append(f"{row['where']}: gold {_gold(row['answer'])!r}: {shown} | ...{tail}")
    return lines


def run_from(path: str, completion_field: str, answer_field: str) -> dict[str, Any]:
    """`bench reward --from RUN`: print the disagreements, return the figures."""
    rows = read_rows(path, completion_field, answer_field)
    graded = scores(rows)
    for line in disagreements(rows, graded):
        print(line)
    return {"bench": "reward", "from": str(path), **summary(rows, graded)}


def _safe(fn: Any, gold: str, completion: str) -> float:
    """A baseline that raises (math-verify on odd input) scores 0, as it would in training."""
    try:
        return float(fn(gold, completion))
    except Exception:  # noqa: BLE001 (any failure of a third-party grader is a 0)
        return 0.0


def _gold(answer: str) -> str:
    return answer.split("####")[-1].strip()
