from pathlib import Path

import pytest

from aioareal.config import AlgoConfig, Config, TrainConfig, load_config
from aioareal.errors import ConfigError, UserError


def test_layering_defaults_yaml_flags_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("algo:\n  lr: 0.5\n  group_size: 4\nrollout:\n  mode: async\n")
    c = load_config(path, ["algo.lr=1e-5"], {"rollout.max_staleness": 3, "train.steps": None})
    assert c.algo.lr == 1e-5  # CLI override beats YAML
    assert c.algo.group_size == 4  # YAML beats default
    assert c.rollout.mode == "async" and c.rollout.max_staleness == 3
    assert c.train.steps == 400  # a None flag leaves the default


@pytest.mark.parametrize("override, message", [
    ("algo.lrr=1", "config key 'algo.lrr': unknown key; did you mean 'algo.lr'?"),
    ("algo.batch_groups=-1", "config key 'algo.batch_groups': must be in [1, 524288], got -1"),
    ("algo.lr=abc", "config key 'algo.lr': expected a number, got 'abc'"),
    ("rollout.mode=fast", "config key 'rollout.mode': expected one of sync | one-step | async, got 'fast'"),
    ("algo.group_size=2.5", "config key 'algo.group_size': expected an integer, got 2.5"),
    ("generation.recompute_kv=maybe", "config key 'generation.recompute_kv': expected true or false, got 'maybe'"),
    ("generation.overlap=maybe", "config key 'generation.overlap': expected true or false or auto, got 'maybe'"),
    ("model.name=", "config key 'model.name': must name a model: 'tiny', a hub name, a local directory, a .gguf "
                    "file or random:<shape>"),
    ("data.prompt_template=Q: {question:.>99999999}", "config key 'data.prompt_template': placeholder "
     "{question:.>99999999}: a width or precision of at most 10000, got 99999999"),
    ("data.prompt_template=Q: {question.x}", "config key 'data.prompt_template': placeholder {question.x}: expected "
     "a field name such as {question} (no attribute or index access, no positional {})"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=[override])
    assert str(e.value) == message


def test_contradictions_are_errors():
    with pytest.raises(ConfigError, match="one-step mode overlaps exactly one batch"):
        load_config(flags={"rollout.mode": "one-step", "rollout.max_staleness": 0})
    with pytest.raises(ConfigError, match="must divide algo.batch_groups"):
        load_config(overrides=["algo.batch_groups=6", "algo.minibatches=4"])
    with pytest.raises(ConfigError, match="sync mode trains only fresh samples"):
        load_config(flags={"rollout.max_staleness": 2})


def test_unknown_section_and_bad_yaml(tmp_path):
    with pytest.raises(UserError, match="unknown config section 'foo'"):
        load_config(overrides=["foo.bar=1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  lr: [1,\n")
    with pytest.raises(UserError, match=r"bad.yaml:\d+: not valid YAML"):
        load_config(bad)
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_mode_defaults_for_staleness():
    assert load_config(flags={"rollout.mode": "async"}).rollout.max_staleness == 2
    assert load_config(flags={"rollout.mode": "one-step"}).rollout.max_staleness == 1
    assert load_config().rollout.max_staleness == 0


def test_lists_from_cli():
    c = load_config(overrides=["reward.functions=a.b:f,c.d:g", "reward.weights=1,0.5"])
    assert c.reward.functions == ["a.b:f", "c.d:g"] and c.reward.weights == [1.0, 0.5]


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("true", True), ("false", False)])
def test_generation_overlap_takes_a_bool_or_auto(value, expected):
    assert load_config(overrides=[f"generation.overlap={value}"]).generation.overlap == expected


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    config = load_config(str(path))
    assert config.model.name


@pytest.mark.parametrize("override, message", [
    ("algo.group_size=100000000", r"algo.group_size': must be in \[2, 65536\]"),
    ("eval.samples=100000000", r"eval.samples': must be in \[0, 65536\]"),
])
def test_counts_no_machine_can_hold_are_refused_at_config_time(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_step_of_more_completions_than_memory_holds_is_refused():
    with pytest.raises(ConfigError, match="16,777,216 completions a step; at most 1,048,576"):
        load_config(None, ["algo.group_size=4096", "algo.batch_groups=4096"])
    assert load_config(None, ["algo.group_size=64", "algo.batch_groups=1024"]).algo.group_size == 64


def test_trl_names_get_the_right_key_not_the_nearest_spelling():
    with pytest.raises(ConfigError, match="TRL's beta is algo.kl_coef"):
        load_config(None, ["algo.beta=0.1"])
    with pytest.raises(ConfigError, match="TRL's max_completion_length is generation.max_new_tokens"):
        load_config(None, ["generation.max_completion_length=64"])
    with pytest.raises(UserError, match="TRL's num_generations is algo.group_size"):
        load_config(None, ["num_generations=8"])
    with pytest.raises(ConfigError, match="did you mean 'algo.lr'"):  # not a TRL name: the nearest key
        load_config(None, ["algo.lrr=1"])


def test_a_temperature_whose_logits_overflow_is_refused():
    with pytest.raises(ConfigError, match=r"generation.temperature': must be >= 0.001, got 1e-300"):
        load_config(None, ["generation.temperature=1e-300"])


def test_each_section_checks_its_fields_from_python_too_and_config_the_fields_they_join():
    """One table (config/limits.py) checks every single field, however the section is built (YAML, key=value or
    Python); `Config` checks what spans fields, however its sections were built."""
    with pytest.raises(ConfigError, match=r"'algo.lr': must be a finite number > 0, got nan"):
        AlgoConfig(lr=float("nan"))
    with pytest.raises(ConfigError, match=r"'train.steps': must be at most 2147483647"):
        TrainConfig(steps=2**40)
    with pytest.raises(ConfigError, match=r"'algo.minibatches': must divide algo.batch_groups=4, got 3"):
        Config(algo=AlgoConfig(batch_groups=4, minibatches=3))
    with pytest.raises(ConfigError, match=r"'rollout.max_staleness': sync mode trains only fresh samples"):
        load_config(None, ["rollout.max_staleness=2"])


def test_a_torchrun_variable_that_is_no_number_is_one_line(monkeypatch):
    from aioareal.run.cell import session

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "abc", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match="environment variable LOCAL_RANK='abc': expected a non-negative integer"):
        with session(load_config(None)):
            pass
