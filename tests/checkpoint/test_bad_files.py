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
