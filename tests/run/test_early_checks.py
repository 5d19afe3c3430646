"""A fresh run's checks before torch loads (aioareal/run/early_checks.py): users' code named in the
config can be found, built-in tools exist; nothing of the user's code runs, and the messages are
the ones the run's own resolution gives."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aioareal.config import load_config
from aioareal.errors import ConfigError, UserError
from aioareal.rewards.reward_functions import RewardFunctionError
from aioareal.run.early_checks import check_before_loading
from aioareal.usercode import resolve_spec

REPO = Path(__file__).resolve().parents[2]


def config(*overrides: str):
    return load_config(overrides=list(overrides))


@pytest.mark.parametrize("overrides, error, message", [
    (["data.episode=nope.py:ep"], UserError, "episode 'nope.py:ep': no such file nope.py"),
    (["data.episode=missing_module_xyz:ep"], UserError, "episode 'missing_module_xyz:ep': no module named "
                                                        "'missing_module_xyz' (is its directory on PYTHONPATH?"),
    (["data.episode=calculator", "tools.names=calc"], ConfigError, "config key 'tools.names': unknown tool 'calc'"),
    (["data.episode=calculator", "tools.functions=no/tools.py:search"], UserError,
     "tool 'no/tools.py:search': no such file no/tools.py"),
    (["reward.functions=nowhere_xyz.rewards:fn"], RewardFunctionError,
     "reward function 'nowhere_xyz.rewards:fn': no module named 'nowhere_xyz'"),
    (["reward.functions=just_a_name"], RewardFunctionError, "reward function 'just_a_name': expected"),
    (["model.name=./no/such/model"], UserError, "model.name './no/such/model': no such file or directory"),
])
def test_a_name_that_cannot_be_found_is_the_error_the_run_would_give(overrides, error, message):
    with pytest.raises(error) as e:
        check_before_loading(config(*overrides))
    assert str(e.value).startswith(message), str(e.value)


def test_the_same_message_as_the_run_itself():
    for spec, what in (("nope.py:ep", "episode"), ("missing_module_xyz.sub:ep", "episode")):
        with pytest.raises(UserError) as early:
            check_before_loading(config(f"data.episode={spec}"))
        with pytest.raises(UserError) as late:
            resolve_spec(spec, what)
        assert str(early.value) == str(late.value)


def test_names_that_exist_pass_without_running_the_users_code(tmp_path, monkeypatch):
    user = tmp_path / "user.py"
    user.write_text("raise SystemExit('the early check ran user code')\n")
    (tmp_path / "user_pkg_xyz").mkdir()
    (tmp_path / "user_pkg_xyz" / "__init__.py").write_text("raise SystemExit('the early check imported a package')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_before_loading(config(f"data.episode={user}:ep", "tools.names=calculator", f"tools.functions={user}:t",
                                f"reward.functions={user}:r,user_pkg_xyz.mod:r", "reward.weights=1,1"))
    check_before_loading(config("data.episode=calculator"))  # a built-in episode
    check_before_loading(config("tools.names=calc"))  # tools are only built for episodes
    for model in ("random:tiny", "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct", str(tmp_path)):
        check_before_loading(config(f"model.name={model}"))  # a shape, a hub name, a named model, a directory


def test_a_missing_local_model_is_the_loaders_own_error():
    from aioareal.models import load_tokenizer

    with pytest.raises(UserError) as early:
        check_before_loading(config("model.name=./no/such/model"))
    with pytest.raises(UserError) as late:
        load_tokenizer("./no/such/model")
    assert str(early.value) == str(late.value)


def test_the_command_line_fails_before_torch_loads(tmp_path):
    probe = ("import sys; from aioareal.cli import main; rc = main(sys.argv[1:]); "
             "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe, "--run-dir", str(tmp_path / "run"), "model.name=random:tiny",
                           "data.episode=missing_module_xyz:ep"], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr
    assert done.stderr.startswith("error: episode 'missing_module_xyz:ep': no module named")
