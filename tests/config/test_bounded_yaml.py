"""YAML with bounds (docs/reliability.md#bounded-readers): nested aliases, self-reference and deep
nesting in config files, sweep files and a run's config.yaml are one short line naming file and
line; an offending value in an error line is cut to a readable length; every real config reads as
`yaml.safe_load` reads it."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from aioareal.config import load_config
from aioareal.config.layering import MAX_DEPTH, load_yaml, load_yaml_text
from aioareal.errors import SHOWN_CHARS, UserError, shown
from aioareal.lab.experiments.load import read_config
from aioareal.lab.experiments.sweep import read_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def laughs(levels: int, at: str) -> str:
    """A few hundred bytes standing for 9^levels values, placed at the config key `at`."""
    levels_ = ["&a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        levels_.append(f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    section, key = at.split(".")
    return f"{section}:\n  {key}: [{', '.join(levels_)}]\n"


def one_short_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message and len(message) < 400, message[:1000]
    return message


def test_nested_aliases_in_a_config_file_are_one_short_line(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(laughs(9, "model.name"))
    assert len(path.read_bytes()) < 700
    with pytest.raises(UserError) as e:
        load_config(path)
    assert one_short_line(e).startswith(f"{path}:") and "expands to more than" in str(e.value)


def test_a_small_alias_expansion_still_reads_and_its_value_is_cut_in_the_error(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(laughs(4, "model.name"))  # 9^4 values: under the bound, and not a string
    with pytest.raises(UserError) as e:
        load_config(path)
    assert one_short_line(e).startswith("config key 'model.name': expected a string, got [['x', 'x'")


@pytest.mark.parametrize("text,problem", [
    ("model: " + "[" * 5000 + "]" * 5000 + "\n", f"nested deeper than {MAX_DEPTH} levels"),
    ("model: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", f"nested deeper than {MAX_DEPTH} levels"),
    ("model: &a [*a]\n", "an alias refers to a value that contains it"),
    ("a: &a [[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]\nb: &b [[[[[[[*a]]]]]]]\nc: [[[*b]]]\n",
     "nested deeper than"),
])
def test_deep_or_cyclic_yaml_is_one_line_naming_the_line(tmp_path, text, problem):
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    for read in (load_config, read_spec, read_config):
        with pytest.raises(UserError) as e:
            read(path)
        assert one_short_line(e).startswith(f"{path}:") and problem in str(e.value)


def test_sweep_files_and_run_configs_are_bounded_too(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(laughs(9, "grid.x"))
    for read in (read_spec, read_config):
        with pytest.raises(UserError) as e:
            read(path)
        assert "expands to more than" in one_short_line(e)


def test_every_shipped_config_reads_as_safe_load_reads_it():
    files = sorted(CONFIGS.rglob("*.yaml"))
    assert len(files) >= 5
    for path in files:
        assert load_yaml(path) == yaml.safe_load(path.read_text()), path


values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                   max_size=4), max_leaves=40)


@settings(max_examples=50, deadline=None)
@given(values)
def test_ordinary_documents_read_as_safe_load_reads_them(value):
    text = yaml.safe_dump(value)
    assert load_yaml_text(text, "x") == yaml.safe_load(text)


@given(st.recursive(st.integers() | st.text(), lambda inner: st.lists(inner, max_size=30), max_leaves=2000))
@settings(max_examples=50, deadline=None)
def test_shown_values_are_cut_to_a_readable_length(value):
    assert len(shown(value)) <= SHOWN_CHARS
    assert len(shown("x" * 10_000_000)) <= SHOWN_CHARS
