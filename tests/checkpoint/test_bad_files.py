"""Files and directories the run cannot use end in one line, exit code 2, and leave nothing behind
(issue 35, item 5): a run directory with a file in its way, a checkpoint whose writing fails (a
full disk), a chat template that refuses a row. docs/reliability.md#bad-input-and-terminal-output."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from aioareal import checkpoint
from aioareal.checkpoint import RunState
from aioareal.cli import main
from aioareal.errors import UserError
from aioareal.group import Example
from aioareal.models.shapes import build_char_tokenizer
from aioareal.tasks.base import PromptRenderer


@pytest.mark.parametrize("inside", [False, True])
def test_run_dir_in_the_way(tmp_path: Path, capsys, inside: bool) -> None:
    """A file where the run directory (or one of its parents) should be: one line, exit 2."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    run_dir = blocker / "run" if inside else blocker
    code = main(["--run-dir", str(run_dir), "--steps", "1", "--no-dashboard", "model.name=random:tiny"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(blocker) in err, err


class FakeModel:
    def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"weights")


class FakeTokenizer:
    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "tokenizer.json").write_text("{}")


def _save(run_dir: Path, step: int) -> Path:
    return checkpoint.save(run_dir, RunState(step=step, cursor=0, elapsed=0.0), FakeModel(), FakeTokenizer(),
                           {"version": step}, {"python": 0}, keep=2)


def test_failed_checkpoint_leaves_no_temp_dir(tmp_path: Path, monkeypatch) -> None:
    """The disk fills while checkpoint 2 is written: its temporary directory is removed, the error
    is one line, checkpoint 1 is still the latest."""
    first = _save(tmp_path, 1)
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        if str(f).endswith("rng.pt"):
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(UserError) as e:
        _save(tmp_path, 2)
    message = str(e.value)
    assert "\n" not in message and "No space left on device" in message and "step 2" in message
    assert not checkpoint.temp_dir(tmp_path, 2).exists()
    assert [p.name for p in checkpoint.checkpoint_dir(tmp_path).iterdir()] == [first.name]
    assert checkpoint.latest_checkpoint(tmp_path) == first
    assert checkpoint.load_state(first).step == 1  # what a checkpoint writes, the type checks read back


def test_state_json_checks_cover_every_run_state_field() -> None:
    import dataclasses

    from aioareal.checkpoint.atomic import STATE_FIELDS

    assert sorted(STATE_FIELDS) == sorted(f.name for f in dataclasses.fields(RunState))


def test_failed_checkpoint_cleans_up_on_any_error(tmp_path: Path) -> None:
    """torch reports a failed write as a RuntimeError: the same cleanup, the same one line."""
    class Broken(FakeModel):
        def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
            super().save_pretrained(path)
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    with pytest.raises(UserError, match="could not be written"):
        checkpoint.save(tmp_path, RunState(step=3, cursor=0, elapsed=0.0), Broken(), FakeTokenizer(), {}, {}, keep=2)
    assert not checkpoint.temp_dir(tmp_path, 3).exists()


def test_a_refused_chat_template_is_one_line() -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = "{{ raise_exception('this template refuses \x1b[2J everything') }}"
    renderer = PromptRenderer(tokenizer, chat=True)
    with pytest.raises(UserError, match="chat template refused row file-train-0"):
        renderer.text(Example(uid="file-train-0", prompt="1+1=", answer="2"))


def test_rotation_prunes_husks_and_nothing_else(tmp_path: Path, monkeypatch) -> None:
    """A checkpoint directory without state.json (a kill while rotation removed it, a copy cut short)
    is removed at the next checkpoint; a link of that name, a file of that name, other names and what
    a link points to are left alone. A resume names each husk in one line and takes the newest whole one."""
    from aioareal.checkpoint import atomic

    _save(tmp_path, 1)
    second = _save(tmp_path, 2)
    root = checkpoint.checkpoint_dir(tmp_path)
    husk = root / "step-000001"
    (husk / "state.json").unlink()  # killed half-way through removing it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not the run's")
    (root / "step-000007").symlink_to(elsewhere, target_is_directory=True)
    (root / "step-000008").write_text("a file, not a checkpoint")
    (root / "notes").mkdir()

    monkeypatch.setattr(atomic, "check_readable", lambda path: None)
    lines: list[str] = []
    assert checkpoint.latest_readable(tmp_path, log=lines.append) == second
    assert len(lines) == 1 and "\n" not in lines[0] and str(husk) in lines[0] and "no state.json" in lines[0]

    third = _save(tmp_path, 3)
    assert not husk.exists()
    assert sorted(p.name for p in root.iterdir()) == ["notes", "step-000002", "step-000003", "step-000007",
                                                       "step-000008"]
    assert (elsewhere / "keep.txt").read_text() == "not the run's"
    assert checkpoint.list_checkpoints(tmp_path) == [second, third] and not checkpoint.husks(tmp_path)


def test_a_kill_during_rotation_leaves_a_husk_not_a_broken_checkpoint(tmp_path: Path, monkeypatch) -> None:
    import shutil

    from aioareal.checkpoint import atomic

    _save(tmp_path, 1)
    _save(tmp_path, 2)
    real = shutil.rmtree

    def killed(path, ignore_errors=False):
        if Path(path).name == "step-000001":  # the kill comes while rotation removes the oldest
            raise KeyboardInterrupt
        real(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(atomic.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 3)
    monkeypatch.undo()
    assert [p.name for p in checkpoint.husks(tmp_path)] == ["step-000001"]
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]


def test_a_full_disk_under_a_runs_files_is_one_line_naming_the_file(tmp_path: Path, monkeypatch, capsys) -> None:
    """A write or flush that fails for want of space says no file name of its own: the run's
    appends and whole-file writes name theirs, so that the command ends in one line, exit 2, not a
    traceback (a run on a full disk failed at its first metrics row)."""
    import os

    from aioareal import io
    from aioareal.errors import guarded

    class FullDisk:
        name = str(tmp_path / "run" / "metrics.jsonl")

        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self) -> None:
            pass

    def append() -> int:
        io.append_jsonl(FullDisk(), [{"step": 1}])
        return 0

    assert guarded(False, append) == 2
    err = capsys.readouterr().err
    assert err == f"error: {FullDisk.name}: No space left on device\n"

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    target = tmp_path / "config.yaml"
    assert guarded(False, lambda: io.atomic_write_text(target, "model: {}\n") or 0) == 2
    assert capsys.readouterr().err == f"error: {target}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []  # its temporary file removed
