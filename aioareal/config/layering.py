"""Config layering: dataclass defaults < YAML file < `--flag`s < `section.key=value` overrides.

Values are checked against the dataclass annotations, so a typo or a wrong type is an error that
names the key (and the nearest valid key), never a silent default.

`load_yaml`: YAML read with bounds (docs/reliability.md#bounded-readers): config files, sweep files and a run's
config.yaml are small, so anything far past their size is refused before it is built.

`yaml.safe_load` runs no code, but it trusts a file's shape: nested aliases ("billion laughs")
make a 317-byte file stand for millions of values, which every later walk (a check, an error line,
a copy) expands; an alias to its own ancestor makes a cycle; nesting thousands deep ends in a
RecursionError. `BoundedLoader`'s composer counts its depth, and a document's size is counted with each
alias expanded (stopping as soon as it passes the bound) before any Python object is built.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, SequenceNode

from ..errors import ConfigError, UserError, shown
from .limits import check_run_shape
from .schema import Config


def section_types() -> dict[str, type]:
    return {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


def known_keys() -> list[str]:
    keys = []
    for section, cls in section_types().items():
        keys += [f"{section}.{f.name}" for f in dataclasses.fields(cls)]
    return keys


# Keys that moved to another section, so an old config gets told where its key went.
MOVED = {"data.arith_digits": "arithmetic.digits", "data.arith_ops": "arithmetic.ops"}
# TRL's GRPOConfig names -> what aioareal calls them: an unknown key named like one of these (in any
# section, or none) is answered with the key, not with the nearest spelling (beta is not dg_eta).
TRL_NAMES = {
    "beta": "algo.kl_coef", "num_generations": "algo.group_size", "learning_rate": "algo.lr",
    "max_completion_length": "generation.max_new_tokens", "max_prompt_length": "data.max_prompt_tokens",
    "temperature": "generation.temperature", "top_p": "generation.top_p", "epsilon": "algo.clip_eps_low",
    "epsilon_high": "algo.clip_eps_high", "num_iterations": "algo.ppo_epochs", "max_steps": "train.steps",
    "seed": "run.seed", "warmup_steps": "algo.warmup_steps", "weight_decay": "algo.weight_decay",
    "max_grad_norm": "algo.grad_clip", "scale_rewards": "algo.adv_std_norm", "reward_weights": "reward.weights",
    "output_dir": "run.run_dir", "save_steps": "run.checkpoint_every", "eval_steps": "eval.every",
    "loss_type": "algo.loss_agg (TRL's bnpo is token-mean, grpo seq-mean, dr_grpo constant)",
    "per_device_train_batch_size": "algo.batch_groups x algo.group_size (completions a step)",
    "generation_batch_size": "algo.batch_groups x algo.group_size (completions a step)",
    "gradient_accumulation_steps": "train.micro_batch_tokens (micro-batches are sized in tokens)",
}


def trl_hint(key: str) -> str | None:
    """'; TRL's beta is algo.kl_coef' when `key` (section.name or name) is a TRL GRPOConfig name."""
    name = key.rpartition(".")[2]
    return f"; TRL's {name} is {TRL_NAMES[name]}" if name in TRL_NAMES else None


def _unknown(key: str, candidates: list[str]) -> ConfigError:
    if key in MOVED:
        return ConfigError(key, f"moved to '{MOVED[key]}'")
    trl = trl_hint(key)
    if trl and TRL_NAMES[key.rpartition(".")[2]].split(" ")[0] != key:
        return ConfigError(key, f"unknown key{trl}")
    near = difflib.get_close_matches(key, candidates, n=1)
    hint = f"; did you mean '{near[0]}'?" if near else ""
    return ConfigError(key, f"unknown key{hint}")


def coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check `value` against a field annotation; CLI strings are parsed as YAML scalars first."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(value, str) and annotation is not str and not _admits_str(annotation):
        value = _yaml_scalar(value, key)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, key)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        # Several types admitted (true | false | auto): name them all, not only the first's.
        expected = [str(e).split(": ", 1)[1].rsplit(", got ", 1)[0].removeprefix("expected ") for e in errors]
        raise ConfigError(key, f"expected {' or '.join(expected)}, got {shown(value)}")
    if origin is Literal:
        if value not in args:
            choices = f"one of {' | '.join(map(str, args))}" if len(args) > 1 else str(args[0])
            raise ConfigError(key, f"expected {choices}, got {shown(value)}")
        return value
    if origin is list:
        if isinstance(value, str):
            value = split_list(value)
        if not isinstance(value, list):
            value = [value]
        return [coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {shown(value)}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {shown(value)}")
        return value
    if annotation is float:
        if isinstance(value, str):
            value = _float_or_none(value)  # YAML 1.1 reads '1e-5' as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {shown(value)}")
        return _to_float(value, key)
    if annotation is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(key, f"expected a string, got {shown(value)}")
        return str(value)
    raise TypeError(f"unsupported annotation {annotation!r} for {key}")


def _to_float(value: int | float, key: str) -> float:
    try:
        return float(value)
    except OverflowError:  # an int past float's range (~1.8e308)
        raise ConfigError(key, f"number too large for a float ({len(str(value))} digits)") from None


def _yaml_scalar(text: str, key: str) -> Any:
    """A command-line value read as YAML ('1e-5', '[a, b]', 'true'); malformed YAML is the key's error."""
    if not text.strip():
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or "malformed YAML"
        raise ConfigError(key, f"not a valid value {shown(text)} ({problem})") from None


def split_list(text: str) -> list[str]:
    """A list written on the command line: `a,b`, `[a,b]`, `[a, 'b']` or `[]`."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    items = (v.strip() for v in text.split(","))
    return [v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"" else v for v in items if v]


def _float_or_none(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _admits_str(annotation: Any) -> bool:
    args = get_args(annotation)
    return annotation is str or str in args or (get_origin(annotation) is Literal)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    data = load_yaml(path) or {}  # aliases and depth bounded: docs/reliability.md#bounded-readers
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of sections (model:, data:, ...), got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[str, str]:
    """'algo.lr=1e-5' -> ('algo.lr', '1e-5')."""
    key, sep, value = text.partition("=")
    if not sep or "." not in key:
        trl = trl_hint(key.strip()) if sep else None
        raise UserError(f"override '{text}': expected section.key=value (for example algo.lr=1e-5){trl or ''}")
    return key.strip(), value


def merge_nested(base: dict[str, dict[str, Any]], layer: dict[str, Any], source: str) -> None:
    """Merge a {section: {key: value}} layer into base, rejecting unknown sections and keys."""
    sections = section_types()
    for section, values in layer.items():
        if section not in sections:
            where = "command line" if source == "cli" else source
            raise UserError(f"{where}: unknown config section '{section}' (expected one of {', '.join(sections)})")
        if not isinstance(values, dict):
            raise ConfigError(section, f"{source}: expected a mapping of keys, got {shown(values)}")
        fields = {f.name for f in dataclasses.fields(sections[section])}
        for key, value in values.items():
            if key not in fields:
                raise _unknown(f"{section}.{key}", known_keys())
            base.setdefault(section, {})[key] = value


def build(layers: dict[str, dict[str, Any]]) -> Config:
    """Construct a validated Config from merged {section: {key: value}} dicts."""
    sections = {}
    for name, cls in section_types().items():
        hints = typing.get_type_hints(cls)
        values = {k: coerce(v, hints[k], f"{name}.{k}") for k, v in layers.get(name, {}).items()}
        sections[name] = cls(**values)  # each section checks its own fields (config/limits.py)
    config = Config(**sections)  # and Config those that span several
    check_run_shape(config)
    return config


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                flags: dict[str, Any] | None = None) -> Config:
    """Defaults < profile (without a file, the profiles below) < YAML at `path` < `flags` ({'rollout.mode': 'async'})
    < `overrides` ('k=v' strings)."""
    return load_with_sources(path, overrides, flags)[0]


def load_with_sources(path: str | Path | None = None, overrides: list[str] | None = None,
                      flags: dict[str, Any] | None = None) -> tuple[Config, dict[str, str]]:
    """The config and, for every key, where its value came from: default, profile NAME (the profiles below),
    file PATH, flag, or key=value."""
    layers: dict[str, dict[str, Any]] = {}
    if path is not None:
        merge_nested(layers, read_yaml(path), str(path))
    set_flags = {k: v for k, v in (flags or {}).items() if v is not None}
    set_overrides = dict(parse_override(o) for o in overrides or [])
    nested: dict[str, dict[str, Any]] = {}
    for key, value in {**set_flags, **set_overrides}.items():
        section, _, name = key.partition(".")
        nested.setdefault(section, {})[name] = value
    rollout = nested.get("rollout", {})
    if "mode" in rollout and "max_staleness" not in rollout:
        # `--mode sync` on an async config means sync with its own K, not the file's K.
        layers.get("rollout", {}).pop("max_staleness", None)
    sources = {f"{s}.{k}": f"file {path}" for s, values in layers.items() for k in values}
    merge_nested(layers, nested, "cli")
    sources.update({k: "flag" for k in set_flags})
    sources.update({k: "key=value" for k in set_overrides})
    if path is None:  # a config file states the run: its unset keys keep the dataclass defaults
        sources.update(_apply_profile(layers))
    return build(layers), {key: sources.get(key, "default") for key in known_keys()}


def _apply_profile(layers: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Put the model's defaults profile beneath what was set; the keys it filled -> 'profile NAME'."""

    name, values = profile_for(str(layers.get("model", {}).get("name", "tiny")),
                               str(layers.get("data", {}).get("task", "arithmetic")))
    filled = {}
    for key, value in values.items():
        section, _, field = key.partition(".")
        if field not in layers.setdefault(section, {}):
            layers[section][field] = value
            filled[key] = f"profile {name}"
    return filled


def to_dict(config: Config) -> dict[str, Any]:
    return dataclasses.asdict(config)


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=None)


def save_config(config: Config, path: str | Path) -> None:
    from ..io import atomic_write_text

    atomic_write_text(path, dump_yaml(config))


# -- profiles ------------------------------------------------------------------------------------
# Defaults that fit the model: the dataclass defaults are the offline tiny model's (8 new tokens,
# lr 1e-4, 400 steps); a pretrained model given without a --config file gets the `pretrained` profile
# instead, beneath anything the user wrote (defaults < profile < flags < key=value). A config file
# states a run: the keys it leaves out keep the dataclass defaults, as they always did.
#
# A model is pretrained unless it is `tiny` or a `random:<shape>` (random weights, for benchmarks).
# The profile's values come from configs/qwen2.5-0.5b-gsm8k.yaml (long answers, lr 1e-6: a rate of
# 1e-4 wrecks a pretrained model in a few steps) and configs/smollm2-sums.yaml (short chat sums).
# `python -m aioareal config --sources` shows which values a run took from it.
PRETRAINED = "pretrained"

_COMMON: dict[str, Any] = {
    "algo.lr": 1e-6, "algo.warmup_steps": 5, "algo.clip_eps_high": 0.28, "algo.loss_agg": "token-mean",
    "algo.group_size": 8, "algo.batch_groups": 32,
    "generation.temperature": 1.0, "train.steps": 200, "eval.every": 20, "run.checkpoint_every": 20,
    "reward.timeout_s": 10.0,
}
# The task decides how long an answer runs: reasoning in words, or a chat-format sum.
_BY_TASK: dict[str, dict[str, Any]] = {
    "arithmetic": {"generation.max_new_tokens": 64, "arithmetic.style": "chat", "algo.lr": 1e-5},
}
_LONG_ANSWERS: dict[str, Any] = {"generation.max_new_tokens": 512}


def is_pretrained(model_name: str) -> bool:
    return model_name != "tiny" and not model_name.startswith("random:")


def profile_for(model_name: str, task: str) -> tuple[str | None, dict[str, Any]]:
    """(profile name, {dotted key: value}) for a model and task; (None, {}) for the tiny model."""
    if not is_pretrained(model_name):
        return None, {}
    return PRETRAINED, {**_COMMON, **_BY_TASK.get(task, _LONG_ANSWERS)}


MAX_DEPTH = 32
MAX_VALUES = 100_000  # values in a document, aliases expanded: a full config has a few hundred


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses documents nested deeper than MAX_DEPTH or expanding past MAX_VALUES."""

    depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_document(self, node: Node) -> Any:
        _count(node, [0], set(), 1)
        return super().construct_document(node)


def _count(node: Node, seen: list[int], path: set[int], depth: int) -> None:
    """Add `node`'s values, aliases expanded, to seen[0]; refuse a cycle, a count past MAX_VALUES or
    (aliases inside aliases) a depth past MAX_DEPTH."""
    seen[0] += 1
    if depth > MAX_DEPTH:
        raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)", node.start_mark)
    if seen[0] > MAX_VALUES:
        raise ComposerError(None, None, f"expands to more than {MAX_VALUES} values (nested aliases?)", node.start_mark)
    if not isinstance(node, (SequenceNode, MappingNode)):
        return
    if id(node) in path:
        raise ComposerError(None, None, "an alias refers to a value that contains it", node.start_mark)
    path.add(id(node))
    children = node.value if isinstance(node, SequenceNode) else [n for pair in node.value for n in pair]
    for child in children:
        _count(child, seen, path, depth + 1)
    path.discard(id(node))


def load_yaml_text(text: str, source: str) -> Any:
    """Parse one YAML document; a syntax error or a refused shape is a one-line UserError naming
    `source` and the line."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{source}{where}: not valid YAML ({problem})") from None


def load_yaml(path: Path) -> Any:
    """`load_yaml_text` of the file at `path` (UTF-8)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return load_yaml_text(text, str(path))
