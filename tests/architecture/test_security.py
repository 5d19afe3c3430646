"""Untrusted files never run code: a crafted checkpoint file is refused with one line (exit code 2)
and its payload never runs; a model with only pickle weights is refused unless model.allow_pickle;
a normal checkpoint still loads and a resumed run still replays exactly."""
from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import random
import shutil
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from aioareal import checkpoint
from aioareal.checkpoint.safeload import UnsafeFile, load_plain
from aioareal.cli import main
from aioareal.config import load_config
from aioareal.errors import UserError
from aioareal.run.recipe import train

QUIET = dict(log=lambda *_: None, printer=lambda row: None)
BASE = ["model.name=random:tiny", "algo.batch_groups=2", "eval.every=0", "data.eval_size=4",
        "run.checkpoint_every=1", "run.keep_checkpoints=3"]


class ShellTouch:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


class PathTouch:
    """Unpickling this calls Path.touch(marker): no shell, only objects from the standard library."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def crafted(payload: object, zip_archive: bool = True) -> bytes:
    """A checkpoint file whose loading with plain pickle would run `payload`."""
    if not zip_archive:
        return pickle.dumps({"python": payload}, protocol=4)
    buf = io.BytesIO()
    torch.save({"optimizer": payload, "version": 2}, buf)
    return buf.getvalue()


def run_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run of 2 steps with a checkpoint after each, stopped before its 3 steps were done."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    train(load_config(overrides=[*BASE, "train.steps=2"], flags={"run.run_dir": str(run_dir)}), **QUIET)
    (run_dir / "DONE").unlink()
    return run_dir


@pytest.fixture
def run_copy(stopped_run, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir)
    return run_dir


@pytest.mark.parametrize("name", ["trainer.pt", "rng.pt"])
@pytest.mark.parametrize("payload", [ShellTouch, PathTouch])
def test_the_payload_is_live_with_plain_pickle(tmp_path, name, payload):
    """The control: the crafted files below really do create the file when unpickled unsafely."""
    marker, file = tmp_path / "pwned", tmp_path / name
    file.write_bytes(crafted(payload(marker)))
    torch.load(file, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("name", ["trainer.pt", "rng.pt"])
@pytest.mark.parametrize("payload", [ShellTouch, PathTouch])
def test_resume_refuses_a_crafted_checkpoint_file_and_runs_nothing(run_copy, tmp_path, capsys, name, payload):
    marker = tmp_path / "pwned"
    newest = checkpoint.latest_checkpoint(run_copy)
    (newest / name).write_bytes(crafted(payload(marker)))
    metrics = (run_copy / "metrics.jsonl").read_text()
    code = main(["--resume", str(run_copy), "--steps", "3", "--no-dashboard"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {newest / name}: refused to load") and "nothing in it was run" in err, err
    assert not marker.exists()
    # A refusal is not corruption: the checkpoint stays where it is, nothing resumed past it.
    assert checkpoint.latest_checkpoint(run_copy) == newest and not checkpoint.broken_checkpoints(run_copy)
    assert (run_copy / "metrics.jsonl").read_text() == metrics


def test_a_bare_pickle_in_place_of_the_archive_is_refused_not_skipped(run_copy, tmp_path):
    marker = tmp_path / "pwned"
    newest = checkpoint.latest_checkpoint(run_copy)
    (newest / "rng.pt").write_bytes(crafted(ShellTouch(marker), zip_archive=False))
    with pytest.raises(UnsafeFile, match="bare pickle stream"):
        checkpoint.latest_readable(run_copy, log=lambda *_: None)
    assert not marker.exists() and not checkpoint.broken_checkpoints(run_copy)


def test_the_cli_exits_2_on_a_crafted_checkpoint(run_copy, tmp_path):
    marker = tmp_path / "pwned"
    newest = checkpoint.latest_checkpoint(run_copy)
    (newest / "trainer.pt").write_bytes(crafted(ShellTouch(marker)))
    proc = subprocess.run([sys.executable, "-m", "aioareal", "--resume", str(run_copy), "--no-dashboard"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "trainer.pt: refused to load" in proc.stderr and "posix.system" in proc.stderr
    assert not marker.exists()


def test_torchscript_code_or_a_second_pickle_in_the_archive_is_refused(tmp_path):
    """torch before 2.6 ran TorchScript archives even with weights_only=True (CVE-2025-32434)."""
    file = tmp_path / "trainer.pt"
    torch.save({"version": 2}, file)
    with zipfile.ZipFile(file, "a") as archive:  # a plain archive plus what TorchScript adds
        archive.writestr("trainer/constants.pkl", pickle.dumps(()))
    with pytest.raises(UnsafeFile, match="'trainer/constants.pkl' .TorchScript code or a second pickle"):
        load_plain(file)


def test_plain_checkpoint_data_loads(tmp_path):
    """What checkpoints hold, including the forms older code wrote, passes the scan and the load."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state(), "cuda": [torch.get_rng_state()],
             "engine": torch.Generator().get_state(), "od": OrderedDict(a=1),
             "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2, dtype=torch.bfloat16)}},
                           "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.99), "foreach": None, "params": [0]}]},
             "scheduler": {"base_lrs": [1e-4], "last_epoch": 2, "lr_lambdas": [None]},
             "scaler": {"scale": 65536.0, "growth_factor": 2.0, "_growth_tracker": 0}, "version": 2}
    torch.save(state, tmp_path / "plain.pt")
    loaded = load_plain(tmp_path / "plain.pt")
    assert loaded["python"] == state["python"]
    assert loaded["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])


def test_restore_rng_accepts_the_python_state_as_a_list():
    saved = checkpoint.rng_state(None)
    expected = [random.random() for _ in range(3)]
    version, internal, gauss = saved["python"]
    checkpoint.restore_rng({**saved, "python": [version, list(internal), gauss]}, None)
    assert [random.random() for _ in range(3)] == expected


def test_a_resumed_run_still_replays_exactly(stopped_run, tmp_path):
    whole = tmp_path / "whole"
    train(load_config(overrides=[*BASE, "train.steps=3"], flags={"run.run_dir": str(whole)}), **QUIET)
    resumed = tmp_path / "resumed"
    shutil.copytree(stopped_run, resumed)
    assert main(["--resume", str(resumed), "--steps", "3", "--no-dashboard"]) == 0
    keep = ("step", "reward_mean", "loss", "grad_norm", "entropy", "lr")
    assert [[r.get(k) for k in keep] for r in run_rows(resumed)] == [[r.get(k) for k in keep] for r in run_rows(whole)]


@pytest.fixture(scope="module")
def pickle_only_model(tmp_path_factory) -> Path:
    """A model directory as older tools saved it: config, tokenizer, and only pytorch_model.bin."""
    from aioareal.models import random_model
    from aioareal.models.shapes import build_char_tokenizer

    path = tmp_path_factory.mktemp("bin-model")
    model = random_model("tiny", torch.float32, torch.device("cpu"))
    model.config.save_pretrained(path)
    build_char_tokenizer().save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")
    return path


def test_a_model_with_only_pickle_weights_is_refused_unless_allowed(pickle_only_model):
    from aioareal.models import load_model

    with pytest.raises(UserError, match=r"pytorch_model\.bin holds pickle weights .*model\.allow_pickle=true"):
        load_model(str(pickle_only_model), torch.float32, torch.device("cpu"))
    model = load_model(str(pickle_only_model), torch.float32, torch.device("cpu"), allow_pickle=True)
    saved = torch.load(pickle_only_model / "pytorch_model.bin", weights_only=True)
    assert all(torch.equal(value, model.state_dict()[key]) for key, value in saved.items())


def test_the_cli_names_the_pickle_file_and_the_key(pickle_only_model, tmp_path, capsys):
    code = main([f"model.name={pickle_only_model}", "--steps", "1", "--no-dashboard", "--run-dir", str(tmp_path / "r"),
                 "algo.batch_groups=2", "data.eval_size=4", "eval.every=0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{pickle_only_model / 'pytorch_model.bin'}" in err and "model.allow_pickle=true" in err, err
