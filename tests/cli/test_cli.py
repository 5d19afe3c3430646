"""Bad input from the command line: one line on stderr naming what and where, exit code 2."""
import subprocess
import sys
from pathlib import Path

import pytest

from aioareal.cli import main

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "aioareal", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.mark.parametrize("args, expected", [
    (["algo.lrr=1"], "error: config key 'algo.lrr': unknown key; did you mean 'algo.lr'?"),
    (["algo.batch_groups=-1"], "error: config key 'algo.batch_groups': must be in [1, 524288], got -1"),
    (["model.name=./no/such/model"], "error: model.name './no/such/model': no such file or directory"),
    (["--config", "missing.yaml"], "error: config file not found: missing.yaml"),
])
def test_bad_input_is_one_line_with_exit_code_2(args, expected, tmp_path):
    result = run_cli(*args, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == expected
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["algo.lrr=1"], ["algo.batch_groups=-1"], ["--config", "missing.yaml"]])
def test_a_bad_config_fails_before_torch_loads(args):
    """A typo costs a fraction of a second, not the seconds torch and transformers take to import."""
    probe = f"import sys; from aioareal.cli import main; rc = main({args!r}); print(rc, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["2", "False"], result.stderr


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


# -- the command line a user expects (issue 36 item 8) ------------------------------------------------
def test_help_lists_every_registered_subcommand(capsys):
    from aioareal.cli import commands

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    listed = out[out.index("commands:"):]
    for name in commands():  # the registry, so a command added later is listed too
        assert f"\n  {name} " in listed, name
    for name in ("train", "warmup", "config", "bench", "simulate", "sweep", "plot", "report", "samples", "export"):
        assert name in commands()


def test_unknown_subcommand_is_one_line_naming_the_commands(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown command 'trian' (commands: train, warmup, sft, config,") and "export" in err
    assert len(err.splitlines()) == 1


def test_version(capsys):
    from aioareal import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"aioareal {__version__}"


@pytest.mark.parametrize("written", ["[a.py:f,b.py:g]", "a.py:f,b.py:g", "[a.py:f, 'b.py:g']"])
def test_list_values_in_brackets_or_bare(written):
    from aioareal.config import load_config

    assert load_config(overrides=[f"reward.functions={written}"]).reward.functions == ["a.py:f", "b.py:g"]
    for weights in ("[1,0.5]", "1,0.5", "[1, 0.5]"):
        config = load_config(overrides=[f"reward.functions={written}", f"reward.weights={weights}"])
        assert config.reward.weights == [1.0, 0.5]
    assert load_config(overrides=["run.trackers=[]"]).run.trackers == []


def test_config_keys_section_filters(capsys):
    assert main(["config", "--keys", "algo"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines and all(line.startswith("algo.") for line in lines)
    assert any(line.startswith("algo.lr = ") for line in lines)
    assert main(["config", "--keys", "nope"]) == 2
    assert "config --keys nope: unknown section (expected one of model, data," in capsys.readouterr().err


# -- defaults that fit the model (issue 36 item 5) ------------------------------------------------------
def sources_of(capsys, *args) -> dict[str, tuple[str, str]]:
    assert main(["config", "--sources", *args]) == 0
    rows = {}
    for line in capsys.readouterr().out.strip().splitlines():
        setting, source = line.split("  # ")
        key, value = setting.split(" = ", 1)
        rows[key] = (value.strip(), source)
    return rows


def test_config_sources_name_default_profile_file_flag_and_override(capsys, tmp_path):
    rows = sources_of(capsys, "model.name=Qwen/Qwen2.5-0.5B-Instruct", "data.task=gsm8k", "--steps", "50")
    assert rows["model.name"] == ("'Qwen/Qwen2.5-0.5B-Instruct'", "key=value")
    assert rows["train.steps"] == ("50", "flag")
    assert rows["algo.lr"] == ("1e-06", "profile pretrained")
    assert rows["generation.max_new_tokens"] == ("512", "profile pretrained")
    assert rows["algo.objective"] == ("'ppo'", "default")
    config = tmp_path / "c.yaml"
    config.write_text("algo:\n  lr: 2.0e-6\n")
    rows = sources_of(capsys, "--config", str(config), "model.name=./some/model")
    assert rows["algo.lr"] == ("2e-06", f"file {config}")
    assert rows["generation.max_new_tokens"][1] == "default"  # a config file states the run: no profile


def test_the_tiny_model_keeps_its_defaults_and_a_pretrained_one_never_gets_them():
    from aioareal.config import load_config
    from aioareal.config.schema import AlgoConfig, GenerationConfig, TrainConfig

    tiny = load_config()
    assert (tiny.algo.lr, tiny.generation.max_new_tokens, tiny.train.steps) == (
        AlgoConfig().lr, GenerationConfig().max_new_tokens, TrainConfig().steps)
    assert load_config(overrides=["model.name=random:tiny"]).algo.lr == AlgoConfig().lr
    for name in ("Qwen/Qwen2.5-0.5B-Instruct", "./local/dir", "smollm2-135m-instruct", "model.gguf"):
        real = load_config(overrides=[f"model.name={name}", "data.task=gsm8k"])
        assert real.algo.lr <= 1e-5 and real.generation.max_new_tokens >= 256 and real.train.steps != 400, name
    sums = load_config(overrides=["model.name=smollm2-135m-instruct"])  # the arithmetic task: short chat answers
    assert sums.arithmetic.style == "chat" and sums.generation.max_new_tokens == 64
    assert load_config(overrides=["model.name=x/y", "algo.lr=3e-6"]).algo.lr == 3e-6  # what is set wins


def test_a_run_on_a_pretrained_model_says_which_defaults_it_took(capsys):
    from aioareal.cli import profile_note, train_parser

    profile_note(train_parser().parse_intermixed_args(["model.name=Qwen/Qwen2.5-0.5B-Instruct", "data.task=gsm8k"]))
    out = capsys.readouterr().out.strip()
    assert out.startswith("model.name=Qwen/Qwen2.5-0.5B-Instruct without --config: ") and len(out.splitlines()) == 1
    assert "'pretrained' profile (algo.lr=1e-06, generation.max_new_tokens=512" in out
    assert "configs/qwen2.5-0.5b-gsm8k.yaml" in out
    profile_note(train_parser().parse_intermixed_args(["model.name=random:tiny"]))
    assert capsys.readouterr().out == ""
    profile_note(train_parser().parse_intermixed_args(["model.name=x/y", "--steps", "3"]))  # a flag is no default
    out = capsys.readouterr().out
    assert "(algo.lr=1e-05, generation.max_new_tokens=64; all:" in out and "train.steps" not in out


def test_a_pretrained_model_on_a_tiny_config_file_says_what_keeps_the_tiny_defaults(capsys):
    from aioareal.cli import profile_note, train_parser

    tiny_file = str(REPO / "configs" / "tiny-arith-async.yaml")
    profile_note(train_parser().parse_intermixed_args(["--config", tiny_file, "model.name=smollm2-135m-instruct"]))
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"model.name=smollm2-135m-instruct with {tiny_file}: the keys it leaves out keep the "
                          "tiny model's defaults (algo.lr=0.0001, generation.max_new_tokens=8")
    assert out.endswith("start from configs/smollm2-sums.yaml") and len(out.splitlines()) == 1
    profile_note(train_parser().parse_intermixed_args(["--config", str(REPO / "configs" / "smollm2-sums.yaml")]))
    assert capsys.readouterr().out == ""  # a file for the model it names
