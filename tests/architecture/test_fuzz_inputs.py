"""Property-based fuzzing of every reader of user input (issue 35, item 5): the config loader, the
`key=value` parser, data rows, metrics.jsonl / samples.jsonl and state.json on resume, and sweep
files. Whatever the bytes, the outcome is a value or exactly one line on stderr starting with
'error:', exit code 2, never a traceback. The loaders run in-process through `errors.guarded` (the
one place a user error becomes its line); a few run end to end through `python -m aioareal`.
docs/reliability.md#bad-input-and-terminal-output lists what each test here checks."""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any

import yaml
from error_helpers import assert_clean, check, outcome
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aioareal.checkpoint import load_state
from aioareal.config import known_keys, load_config
from aioareal.config.layering import section_types
from aioareal.lab.experiments.load import read_config, read_frame
from aioareal.lab.experiments.sweep import plan
from aioareal.monitor.metrics import RunLog
from aioareal.run.build import task_from
from aioareal.tasks.base import PromptRenderer
from aioareal.use.samples import read_samples

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = known_keys()


# -- values: what a YAML file, a key=value or a JSON line may hold -------------------------------------
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-10**400, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["nan", ".inf", "-.inf", "1e999", "[", "{a: [}", "!!python/object:os.system", "0x1F", "1e-5",
                     "\x1b[2J", "[bold red]x[/]", "auto", "cuda:0", "cpu", "{question}", "{a.__class__}", "{0}",
                     "{a!x}", "{a:{b}}", "true", "~", "", "-1", "0"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
config_keys = st.sampled_from(KEYS) | st.text(max_size=15)


def _nest(pairs: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in pairs.items():
        section, _, name = key.partition(".")
        if isinstance(nested.setdefault(section, {}), dict):
            nested[section][name] = value
    return nested


@contextlib.contextmanager
def scratch() -> Any:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


# -- the config loader ----------------------------------------------------------------------------------
@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_config_file_of_any_bytes(data: bytes) -> None:
    with scratch() as d:
        (d / "c.yaml").write_bytes(data)
        check(lambda: load_config(d / "c.yaml"))


@FUZZ
@given(st.dictionaries(config_keys, values, max_size=6))
def test_config_file_of_any_keys_and_values(pairs: dict[str, Any]) -> None:
    with scratch() as d:
        (d / "c.yaml").write_text(yaml.safe_dump(_nest(pairs), allow_unicode=True))
        check(lambda: load_config(d / "c.yaml"))


@FUZZ
@given(st.lists(st.tuples(config_keys, st.text(max_size=30) | scalars.map(str)), max_size=4),
       st.lists(st.text(max_size=30), max_size=2))
def test_key_value_overrides(pairs: list[tuple[str, str]], raw: list[str]) -> None:
    check(lambda: load_config(overrides=[f"{k}={v}" for k, v in pairs] + raw))


@FUZZ
@given(st.sampled_from(KEYS), st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**30, 10**30))
def test_numbers_out_of_range_are_refused_at_config_time(key: str, number: float) -> None:
    """Any number for any key: a Config whose every number is finite and fits, or one line naming the key."""
    code, err = outcome(lambda: load_config(overrides=[f"{key}={number!r}"]))
    assert_clean(code, err)
    if code == 0:
        config = load_config(overrides=[f"{key}={number!r}"])
        value = getattr(getattr(config, key.split(".")[0]), key.split(".")[1])
        for v in value if isinstance(value, list) else [value]:
            assert not isinstance(v, float) or math.isfinite(v) or key == "algo.tis_cap", (key, v)
            assert not isinstance(v, int) or abs(v) < 2**32, (key, v)
    else:
        assert f"'{key}" in err or "config key" in err, err


def test_every_numeric_field_has_a_range() -> None:
    """The audit of issue 35: each int/float config field is in config/limits.RANGES (a new numeric
    key must say its valid range there), and no entry names a key that does not exist."""
    from aioareal.config.limits import RANGES

    def kinds(hint: Any) -> set[Any]:
        return {hint}.union(*(kinds(a) for a in typing.get_args(hint)))

    numeric = {f"{section}.{name}" for section, cls in section_types().items()
               for name, hint in typing.get_type_hints(cls).items() if kinds(hint) & {int, float}}
    assert sorted(numeric - set(RANGES)) == [], "add these to aioareal/config/limits.py RANGES"
    assert sorted(set(RANGES) - numeric) == []


# -- data rows ----------------------------------------------------------------------------------------
json_rows = st.lists(st.dictionaries(st.sampled_from(["question", "answer", "x", "tools", "system"]), values,
                                     max_size=4) | values, max_size=5)


def _row_bytes(rows: list[Any], garbage: bytes, suffix: str) -> bytes:
    if suffix == ".jsonl":
        return b"".join(json.dumps(r).encode() + b"\n" for r in rows) + garbage
    if suffix == ".json":
        return json.dumps(rows).encode() + garbage
    lines = ["question,answer"] + [",".join(str(v) for v in (r.values() if isinstance(r, dict) else [r]))
                                   for r in rows]
    return "\n".join(lines).encode() + garbage


@FUZZ
@given(json_rows, st.binary(max_size=20) | st.sampled_from([b"", b"\xff\xfe", b"\xe2\x82", b"{", b"NaN\n"]),
       st.sampled_from([".jsonl", ".json", ".csv"]), st.booleans())
def test_data_rows(rows: list[Any], garbage: bytes, suffix: str, skip_bad: bool) -> None:
    with scratch() as d:
        path = d / f"rows{suffix}"
        path.write_bytes(_row_bytes(rows, garbage, suffix))

        def load() -> None:
            config = load_config(overrides=["data.task=file", f"data.path={path}", "data.eval_size=1",
                                            f"data.skip_bad_rows={str(skip_bad).lower()}",
                                            "data.prompt_template=Q: {question}"])
            train, held_out = task_from(config).splits()
            renderer = PromptRenderer(None, chat=False, template=config.data.prompt_template)
            for example in train + held_out:
                renderer.text(example)
        check(load)


# -- run files on resume and in samples / report / plot ---------------------------------------------------
jsonl_lines = st.lists(st.one_of(
    st.fixed_dictionaries({"step": st.integers(0, 5) | values, "reward": values}, optional={"text": values}),
    values.map(json.dumps), st.binary(max_size=10).map(lambda b: b.decode("latin-1"))), max_size=5)


def _jsonl(lines: list[Any], tail: bytes) -> bytes:
    body = b"".join((x if isinstance(x, str) else json.dumps(x)).encode("utf-8", "surrogateescape") + b"\n"
                    for x in lines)
    return body + tail


tails = st.sampled_from([b"", b'{"step": 1, "rew', b"\xe2\x82", b"\xff", b"[1]\n", b'{"step": "x"}\n'])


@FUZZ
@given(jsonl_lines, jsonl_lines, tails, st.integers(0, 4))
def test_metrics_and_samples_on_resume(metrics: list[Any], samples: list[Any], tail: bytes, step: int) -> None:
    with scratch() as d:
        (d / "metrics.jsonl").write_bytes(_jsonl(metrics, tail))
        (d / "samples.jsonl").write_bytes(_jsonl(samples, tail))
        check(lambda: RunLog(d, resume_step=step).close())


@FUZZ
@given(jsonl_lines, tails)
def test_samples_report_and_plot_readers(lines: list[Any], tail: bytes) -> None:
    with scratch() as d:
        (d / "samples.jsonl").write_bytes(_jsonl(lines, tail))
        (d / "config.yaml").write_bytes(_jsonl(lines, tail))
        check(lambda: read_samples(d))
        check(lambda: read_frame(d / "samples.jsonl", sort=True))
        check(lambda: read_config(d / "config.yaml"))


state_values = st.fixed_dictionaries({}, optional={k: values | st.integers(-3, 9) for k in (
    "step", "cursor", "elapsed", "ledger", "reward_failures", "config_digest", "ranks", "other")})


@FUZZ
@given(state_values.map(json.dumps) | values.map(json.dumps) | st.binary(max_size=30).map(
    lambda b: b.decode("latin-1")), tails)
def test_state_json(text: str, tail: bytes) -> None:
    with scratch() as d:
        (d / "state.json").write_bytes(text.encode("utf-8", "surrogateescape") + tail)
        check(lambda: load_state(d))


# -- sweep files ------------------------------------------------------------------------------------------
sweep_specs = st.fixed_dictionaries({}, optional={
    "name": values, "base": values, "set": st.dictionaries(config_keys, values, max_size=2) | values,
    "cases": st.lists(st.dictionaries(config_keys, values, max_size=2), max_size=2) | values,
    "grid": st.dictionaries(config_keys, st.lists(values, max_size=2), max_size=2) | values,
    "seeds": st.lists(st.integers(-2, 2**40), max_size=2) | values, "bogus": values})


@FUZZ
@given(sweep_specs.map(lambda s: yaml.safe_dump(s, allow_unicode=True)) | st.text(max_size=80))
def test_sweep_files(text: str) -> None:
    with scratch() as d:
        (d / "s.yaml").write_text(text)
        check(lambda: plan(d / "s.yaml", d / "runs"))


# -- end to end: the same through `python -m aioareal` ------------------------------------------------------
def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "aioareal", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, errors="replace", timeout=120)


def test_end_to_end_exit_2_and_one_line(tmp_path: Path) -> None:
    """Malformed key=value, an impossible value with a hostile device string, a config file that is
    not UTF-8, a samples.jsonl with undecodable bytes: exit code 2, one clean line, no traceback."""
    (tmp_path / "bad.yaml").write_bytes(b"algo:\n  lr: \xff\xfe\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "samples.jsonl").write_bytes(b'{"step": 1, "reward": 1, "text": "ok"}\n\xff\xfe\n')
    cases = [["config", "algo.lr=["], ["config", "algo.adam_beta2=2", "rollout.gen_device=\x1b[2J"],
             ["config", "--config", "bad.yaml"], ["samples", "run"]]  # light commands: no torch import
    for args in cases:
        result = _cli(args, tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert_clean(2, result.stderr)
