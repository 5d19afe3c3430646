"""Bad input from the command line: one line on stderr naming what and where, exit code 2."""
import subprocess
import sys

import pytest

from aioareal.cli import main


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "aioareal", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.mark.parametrize("args, expected", [
    (["algo.lrr=1"], "error: config key 'algo.lrr': unknown key; did you mean 'algo.lr'?"),
    (["algo.batch_groups=-1"], "error: config key 'algo.batch_groups': must be > 0, got -1"),
    (["model.name=./no/such/model"], "error: model.name './no/such/model': no such file or directory"),
    (["--config", "missing.yaml"], "error: config file not found: missing.yaml"),
])
def test_bad_input_is_one_line_with_exit_code_2(args, expected, tmp_path):
    result = run_cli(*args, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == expected
    assert "Traceback" not in result.stderr


def test_malformed_jsonl_names_file_and_line(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "oops"\n')
    result = run_cli("model.name=random:tiny", "data.task=gsm8k", f"data.path={data}", "--run-dir",
                     str(tmp_path / "run"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {data}:2: malformed JSON line")
    assert len(result.stderr.strip().splitlines()) == 1


def test_debug_shows_the_traceback():
    from aioareal.errors import ConfigError

    with pytest.raises(ConfigError):
        main(["--debug", "algo.lrr=1"])


def test_config_command_prints_resolved_yaml(capsys):
    assert main(["config", "--mode", "async", "--max-staleness", "3"]) == 0
    out = capsys.readouterr().out
    assert "mode: async" in out and "max_staleness: 3" in out
    assert main(["config", "--keys"]) == 0
    assert "algo.kl_coef = 0.0  # k3 KL penalty" in capsys.readouterr().out
