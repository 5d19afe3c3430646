"""An evaluation stopped part-way continues from the prompts it finished (use/eval_journal.py): the
same command with the same --out generates only the rest, and its rows and figures equal an unbroken
evaluation's; settings that changed start afresh; a torn or foreign line is skipped; a planted link
in the journal's place is refused, one in the rows' place removed, not followed; the journal goes when
the evaluation completes; a second writer on one --out is refused in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from aioareal.checkpoint.atomic import own_run_dir, release_run_dir
from aioareal.cli import main
from aioareal.use import eval_journal

PROMPTS = 8
ARGS = ["eval", "tiny", f"data.eval_size={PROMPTS}", "--max-new-tokens", "24"]


def rows(out):
    return sorted((r["prompt_id"], r["text"], r["passed"]) for r in map(json.loads, (out / "eval.jsonl").open()))


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory, tiny_model_path):
    out = tmp_path_factory.mktemp("unbroken")
    assert main([*ARGS, "--out", str(out)]) == 0
    return out


def stop_after(monkeypatch, prompts: int) -> list[int]:
    """Make the journal's writer raise KeyboardInterrupt once, when `prompts` prompts are kept; returns
    the indices it was handed, across runs."""
    handed: list[int] = []
    stopped: list[bool] = []
    real = eval_journal.Journal.keeper

    def keeper(self, key):
        keep = real(self, key)

        def counted(index, completions):
            keep(index, completions)
            handed.append(index)
            if len(handed) == prompts and not stopped:
                stopped.append(True)
                raise KeyboardInterrupt
        return counted
    monkeypatch.setattr(eval_journal.Journal, "keeper", keeper)
    return handed


def test_a_stopped_evaluation_continues_from_its_finished_prompts(unbroken, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    handed = stop_after(monkeypatch, 3)
    assert main([*ARGS, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "finished prompts are kept in" in err and f"--out {out}" in err
    assert not (out / "eval.jsonl").exists()
    first = list(handed)
    assert len(first) == 3
    assert main([*ARGS, "--out", str(out)]) == 0
    assert "3 of 8 prompts kept" in capsys.readouterr().err
    again = handed[3:]
    assert sorted(first + again) == list(range(PROMPTS))  # each prompt generated once in all
    assert rows(out) == rows(unbroken)
    assert json.loads((out / "figures.json").read_text())["targets"] == \
        json.loads((unbroken / "figures.json").read_text())["targets"]
    assert not (out / eval_journal.FILE).exists()


def test_changed_settings_start_afresh_and_bad_lines_are_skipped(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    handed = stop_after(monkeypatch, 3)
    assert main([*ARGS, "--out", str(out)]) == 130
    journal = out / eval_journal.FILE
    lines = journal.read_text().splitlines()
    row = json.loads(lines[0])
    forged = [json.dumps({**row, "prompt": 4, "tokens": [[10 ** 9]]}),  # no tokenizer has that id
              json.dumps({**row, "prompt": 5, "finish": ["exploded"]}), "[1, 2", "\x00\x00"]
    journal.write_text("\n".join(lines + forged) + '\n{"key": "torn')
    capsys.readouterr()
    assert main([*ARGS, "--out", str(out)]) == 0
    assert "3 of 8 prompts kept" in capsys.readouterr().err
    assert sorted(handed) == list(range(PROMPTS))  # 4 and 5 generated: their forged lines were not used
    handed.clear()
    assert main([*ARGS[:-1], "16", "--out", str(out)]) == 0  # nothing kept at this length
    assert "kept" not in capsys.readouterr().err and sorted(handed) == list(range(PROMPTS))


def test_a_planted_link_in_the_journals_place_is_refused(tmp_path, capsys, tiny_model_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, out / eval_journal.FILE)
    assert main([*ARGS, "--out", str(out)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert victim.read_text() == "precious"


def test_a_second_writer_on_one_out_is_refused_and_touches_nothing(tmp_path, tiny_model_path):
    out = tmp_path / "out"
    own_run_dir(out)  # a live run or evaluation holds the folder (in-process: a reentrant count)
    try:
        done = subprocess.run([sys.executable, "-m", "aioareal", *ARGS, "--out", str(out)], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        release_run_dir(out)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{out} is in use by another run or evaluation (pid {os.getpid()})" in done.stderr
    assert "--out" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_a_link_planted_as_the_rows_file_is_removed_not_followed(tmp_path, tiny_model_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, out / "eval.jsonl.partial")
    assert main([*ARGS, "--out", str(out)]) == 0
    assert victim.read_text() == "precious" and (out / "eval.jsonl").is_file()
