"""An evaluation stopped part-way continues from the prompts it finished (use/eval_journal.py): the
same command with the same --out generates only the rest, and its greedy rows and figures equal an
unbroken evaluation's, for zero-shot (greedy and -n) and lm-eval alike; settings that changed start
afresh; torn, forged or mis-sized lines are skipped and a torn tail never swallows the next line; a
planted link in the journal's place is refused, one in the rows' place removed, not followed; the
journal goes when the evaluation completes; a second writer on one --out is refused in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aioareal.checkpoint.atomic import own_run_dir, release_run_dir
from aioareal.cli import main
from aioareal.group import Completion
from aioareal.use import eval_journal

PROMPTS = 8
ARGS = ["eval", "tiny", f"data.eval_size={PROMPTS}", "--max-new-tokens", "24"]
SLICE = Path(__file__).resolve().parents[1] / "data" / "gsm8k"
LM_EVAL = ["eval", "tiny", "--protocol", "lm-eval", "data.task=gsm8k", f"data.path={SLICE / 'train.jsonl'}",
           f"data.eval_path={SLICE / 'test.jsonl'}", "data.eval_size=6"]


def rows(out: Path, greedy_only: bool = False) -> list[tuple]:
    read = map(json.loads, (out / "eval.jsonl").open())
    return sorted((r["protocol"], r["prompt_id"], r["sample"], r["text"]) for r in read
                  if r["greedy"] or not greedy_only)


def targets(out: Path) -> list[dict]:
    columns = json.loads((out / "figures.json").read_text())["targets"]
    return [{k: v for k, v in c.items() if k != "resumed_prompts"} for c in columns]


def stop_after(monkeypatch, prompts: int) -> list[tuple[str, int]]:
    """Make the journal's writer raise KeyboardInterrupt once, when `prompts` prompts are kept; returns
    the (phase key, index) pairs it was handed, across runs."""
    handed: list[tuple[str, int]] = []
    stopped: list[bool] = []
    real = eval_journal.Journal.keeper

    def keeper(self, key):
        keep = real(self, key)

        def counted(index, completions):
            keep(index, completions)
            handed.append((key, index))
            if len(handed) == prompts and not stopped:
                stopped.append(True)
                raise KeyboardInterrupt
        return counted
    monkeypatch.setattr(eval_journal.Journal, "keeper", keeper)
    return handed


def indices(handed: list[tuple[str, int]]) -> list[int]:
    return sorted(i for _, i in handed)


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory, tiny_model_path):
    out = tmp_path_factory.mktemp("unbroken")
    assert main([*ARGS, "-n", "2", "--out", str(out)]) == 0
    return out


def test_a_stopped_evaluation_continues_from_its_finished_prompts(unbroken, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    handed = stop_after(monkeypatch, 3)
    assert main([*ARGS, "-n", "2", "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "finished prompts are kept in" in err and f"--out {out}" in err
    assert not (out / "eval.jsonl").exists() and len(handed) == 3
    assert main([*ARGS, "-n", "2", "--out", str(out)]) == 0
    assert "tiny greedy: 3 of 8 prompts kept" in capsys.readouterr().err
    phases = {key for key, _ in handed}
    assert len(phases) == 2  # greedy, then n=2
    for phase in phases:  # each prompt of each phase generated once in all
        assert sorted(i for key, i in handed if key == phase) == list(range(PROMPTS))
    assert rows(out, greedy_only=True) == rows(unbroken, greedy_only=True)
    assert len(rows(out)) == len(rows(unbroken)) == PROMPTS * 3
    column = json.loads((out / "figures.json").read_text())["targets"][0]
    assert column["resumed_prompts"] == {"greedy": 3}  # the figures say the draws came from two runs
    assert column["pass@1_greedy"] == targets(unbroken)[0]["pass@1_greedy"]
    assert not (out / eval_journal.FILE).exists()


def test_lm_eval_continues_too(tmp_path, monkeypatch, capsys, tiny_model_path):
    whole, out = tmp_path / "whole", tmp_path / "out"
    assert main([*LM_EVAL, "--out", str(whole)]) == 0
    handed = stop_after(monkeypatch, 2)
    assert main([*LM_EVAL, "--out", str(out)]) == 130
    assert main([*LM_EVAL, "--out", str(out)]) == 0
    assert "tiny lm-eval: 2 of 6 prompts kept" in capsys.readouterr().err
    assert indices(handed) == list(range(6))
    assert rows(out) == rows(whole) and targets(out) == targets(whole)


def test_changed_settings_start_afresh_and_bad_lines_are_skipped(tmp_path, monkeypatch, capsys, tiny_model_path):
    out = tmp_path / "out"
    handed = stop_after(monkeypatch, 3)
    assert main([*ARGS, "--out", str(out)]) == 130
    capsys.readouterr()
    assert main([*ARGS[:-1], "16", "--out", str(out)]) == 0  # another length: nothing of the first run kept
    assert "kept" not in capsys.readouterr().err and len(handed) == 3 + PROMPTS
    handed.clear()
    stopped = stop_after(monkeypatch, 3)
    assert main([*ARGS, "--out", str(out)]) == 130
    journal = out / eval_journal.FILE
    lines = journal.read_text().splitlines()
    row = json.loads(lines[0])
    free = [i for i in range(PROMPTS) if i not in indices(stopped)]
    forged = [json.dumps({**row, "prompt": free[0], "tokens": [[10 ** 9]]}),  # no tokenizer has that id
              json.dumps({**row, "prompt": free[1], "finish": ["exploded"]}),
              json.dumps({**row, "prompt": free[2], "tokens": [[1], [2]], "finish": ["stop", "stop"]}),  # two
              "[1, 2", "\x00\x00", "\udcff"]
    journal.write_text("\n".join(lines + forged) + "\n", errors="surrogateescape")
    capsys.readouterr()
    assert main([*ARGS, "--out", str(out)]) == 0
    assert "3 of 8 prompts kept" in capsys.readouterr().err
    assert indices(stopped) == list(range(PROMPTS))  # the forged prompts were generated, not read


def test_a_torn_tail_never_swallows_the_next_line(tmp_path, tiny_model_path):
    (tmp_path / eval_journal.FILE).write_text('{"key": "torn", "prompt": 0, "tok')
    journal = eval_journal.Journal(tmp_path)
    keep = journal.keeper("k")
    keep(4, [Completion(tokens=[5, 6], finish_reason="stop_string")])  # lm-eval's stop at "Question:"
    journal.close(complete=False)
    again = eval_journal.Journal(tmp_path)
    kept = again.take("k", 8, 1, "label", 100, 10)
    again.close(complete=True)
    assert list(kept) == [4] and kept[4][0].tokens == [5, 6] and kept[4][0].finish_reason == "stop_string"
    assert not (tmp_path / eval_journal.FILE).exists()


@pytest.mark.parametrize("plant", ["link", "fifo", "folder"])
def test_a_planted_file_in_the_journals_place_is_refused(plant, tmp_path, capsys, tiny_model_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = out / eval_journal.FILE
    {"link": lambda: os.symlink(victim, path), "fifo": lambda: os.mkfifo(path), "folder": path.mkdir}[plant]()
    assert main([*ARGS, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a regular file" in err
    assert victim.read_text() == "precious"


def test_a_second_writer_on_one_out_is_refused_and_touches_nothing(tmp_path, tiny_model_path):
    out = tmp_path / "out"
    own_run_dir(out)  # a live run or evaluation holds the folder
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
