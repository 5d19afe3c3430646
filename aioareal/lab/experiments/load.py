"""Find runs under a path, read their files, and name their configurations.

A path is either one run directory (config.yaml directly inside) or a sweep directory holding one
run directory per grid point and seed. Runs whose configs differ only in bookkeeping (run.*,
warmup.*: seed, run_dir, dashboard, checkpoints) belong to the same configuration; its label lists
the config keys that do vary, e.g. "mode=async K=3 objective=dg".
"""
from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...config import Config, to_dict
from ...config.layering import load_yaml
from ...errors import DataError, UserError, reading
from ...io import iter_jsonl

SHORT_NAMES = {"rollout.mode": "mode", "rollout.max_staleness": "K", "algo.objective": "objective"}
NAMES = {**SHORT_NAMES, "eval.every": "eval_every"}  # where the last key component alone would confuse
BOOKKEEPING = ("run.", "warmup.")
MODE_ORDER = {"sync": 0, "one-step": 1, "async": 2}
DEFAULT_FRACTION = 0.9  # derived threshold: this fraction of the best configuration's final pass rate


@dataclass
class Run:
    name: str
    dir: Path
    config: dict[str, Any]
    metrics: pd.DataFrame  # one row per step, sorted by step, step 0 = evaluation before training
    samples: pd.DataFrame  # one row per trained sample; empty if samples.jsonl is missing
    finished: bool         # a DONE file exists (older runs never wrote one)

    def setting(self, key: str, default: Any = None) -> Any:
        """A config value by dotted key, e.g. run.setting("algo.group_size")."""
        return flatten(self.config).get(key, default)

    @property
    def last_step(self) -> int:
        return int(self.metrics["step"].iloc[-1])

    @property
    def complete(self) -> bool:
        """Finished, or (older runs without DONE) reached train.steps."""
        return self.finished or self.last_step >= int(self.setting("train.steps", 0) or 0)

    @property
    def samples_per_step(self) -> int:
        return int(self.setting("algo.batch_groups", 0)) * int(self.setting("algo.group_size", 0))

    def evals(self) -> pd.DataFrame:
        """The evaluation rows: step, time, eval_pass_rate."""
        if "eval_pass_rate" not in self.metrics:
            return pd.DataFrame({"step": [], "time": [], "eval_pass_rate": []})
        m = self.metrics[self.metrics["eval_pass_rate"].notna()]
        return m[["step", "time", "eval_pass_rate"]].reset_index(drop=True)

    @property
    def final_pass_rate(self) -> float:
        e = self.evals()
        return float(e["eval_pass_rate"].iloc[-1]) if len(e) else math.nan

    def first_reaching(self, threshold: float) -> pd.Series | None:
        """The first evaluation row whose pass rate is >= threshold, or None."""
        e = self.evals()
        hit = e[e["eval_pass_rate"] >= threshold]
        return hit.iloc[0] if len(hit) else None


def load_runs(path: str | Path) -> list[Run]:
    """Every run under `path` (a run directory or a sweep directory) that has metrics rows."""
    path = Path(path)
    dirs = run_dirs(path)
    runs = [run for d in dirs if len((run := load_run(d, path)).metrics)]
    if not runs:
        why = "none has any rows in metrics.jsonl" if dirs else "no run directories (with a config.yaml) inside"
        raise UserError(f"{path}: no runs to read: {why}")
    return runs


def run_dirs(path: Path) -> list[Path]:
    if (path / "config.yaml").is_file():
        return [path]
    if not path.is_dir():
        raise UserError(f"{path}: no such directory (expected a run or sweep directory under runs/)")
    return sorted(d for d in path.iterdir()
                  if d.is_dir() and not d.name.startswith(("_", ".")) and (d / "config.yaml").is_file())


def load_run(d: Path, root: Path) -> Run:
    config = with_defaults(read_config(d / "config.yaml"))
    return Run(name=d.name if d == root else str(d.relative_to(root)), dir=d, config=config,
               metrics=read_frame(d / "metrics.jsonl", sort=True),
               samples=read_frame(d / "samples.jsonl", columns=SAMPLE_COLUMNS),
               finished=(d / "DONE").exists())


def read_config(file: Path) -> dict[str, Any]:
    config = load_yaml(file)  # aliases and depth bounded: docs/reliability.md#bounded-readers
    if not isinstance(config, dict):
        raise UserError(f"{file}: expected a mapping of config sections, got {type(config).__name__}")
    return config


def with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """The run's config with every key it lacks at today's default: a key added to the project after
    the run was recorded, so that a run from before it and one after it, both at the default, fall
    into one configuration rather than two ("optimizer_moments=none" beside "=float32")."""
    return _merged(to_dict(Config()), config)


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _merged(base[key], value) if both else value
    return out


SAMPLE_COLUMNS = ("staleness",)  # what report and plot draw from samples.jsonl


def read_frame(file: Path, sort: bool = False, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """A JSONL file as a DataFrame of numbers (NaN where a value is null, missing or not a JSON
    number), read line by line into 8 bytes a value; `columns` keeps only
    those, so a samples file of gigabytes costs what its one column does. A torn last line is skipped."""
    with reading(file, "a run's JSON lines"):
        return _frame(file, sort, columns)


def _number(value: Any) -> float:
    """A JSON number as a float; anything else (null, true, a string, a list, an int past float range) is NaN."""
    try:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:
        return math.nan


def _columns(file: Path, keep: tuple[str, ...] | None) -> dict[str, array]:
    """Column name -> its values, every column as long as the file has rows."""
    cols: dict[str, array] = {}
    rows = 0
    for row in iter_jsonl(file, skip_bad=True) if file.is_file() else ():
        for key, value in row.items():
            if keep is None or key in keep:
                col = cols.setdefault(key, array("d"))
                col.extend(array("d", [math.nan]) * (rows - len(col)))  # rows that lacked it
                col.append(_number(value))
        rows += 1
    for col in cols.values():
        col.extend(array("d", [math.nan]) * (rows - len(col)))
    return cols


def _frame(file: Path, sort: bool, columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    df = pd.DataFrame({key: np.array(col, dtype=np.float64) for key, col in _columns(file, columns).items()})
    if sort and len(df):
        if "step" not in df.columns:
            raise DataError(f"{file}: no row has a 'step' (not a run's metrics file)")
        df = df[df["step"].abs() < math.inf].copy()  # a step that is not a finite number (null, "3", Infinity): no step
        # Every row of a run's metrics has its time; one written by hand or cut may not: no time, not a KeyError.
        df["time"] = df["time"].where(df["time"].abs() < math.inf) if "time" in df.columns else math.nan
        # A resumed run may repeat a step if it crashed after writing it; the last write wins.
        df = df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)
    return df


# -- configurations ------------------------------------------------------------------------------
def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _hashable(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v


def varying_keys(runs: list[Run]) -> list[str]:
    """Config keys (not bookkeeping) whose values differ across runs; the short-named ones first."""
    flat = [flatten(r.config) for r in runs]
    keys = sorted(set().union(*flat))
    vary = [k for k in keys if not k.startswith(BOOKKEEPING) and len({_hashable(f.get(k)) for f in flat}) > 1]
    return [k for k in SHORT_NAMES if k in vary] + [k for k in vary if k not in SHORT_NAMES]


def _names(keys: list[str]) -> dict[str, str]:
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: NAMES.get(k) or (n if last.count(n) == 1 else k) for k, n in zip(keys, last)}


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}" if float(f"{v:g}") == v else repr(v)
    return str(_hashable(v))


def configuration_labels(runs: list[Run]) -> dict[str, str]:
    """Run name -> configuration label; runs that differ only by seed (or bookkeeping) share a label."""
    keys = varying_keys(runs)
    if not keys:  # one configuration: summarise its mode, K and objective
        keys = [k for k in SHORT_NAMES if runs and k in flatten(runs[0].config)]
    names = _names(keys)
    labels = {r.name: " ".join(f"{names[k]}={_fmt(r.setting(k))}" for k in keys) for r in runs}
    return {name: label or "all" for name, label in labels.items()}


def _rank(key: str, v: Any) -> tuple[int, float, str]:
    if key == "rollout.mode":
        return (0, MODE_ORDER.get(v, len(MODE_ORDER)), str(v))
    if isinstance(v, (int, float)):
        return (0, float(v), "")
    return (2, 0.0, "") if v is None else (1, 0.0, str(_hashable(v)))


def by_configuration(runs: list[Run]) -> dict[str, list[Run]]:
    """Label -> its runs, configurations in a reading order (sync < one-step < async, then K, ...)."""
    keys = varying_keys(runs)
    labels = configuration_labels(runs)
    ordered = sorted(runs, key=lambda r: ([_rank(k, r.setting(k)) for k in keys], r.name))
    groups: dict[str, list[Run]] = {}
    for r in ordered:
        groups.setdefault(labels[r.name], []).append(r)
    return groups


def choose_threshold(runs: list[Run], threshold: float | None = None) -> tuple[float, str]:
    """The pass-rate threshold and a sentence saying how it was chosen."""
    if threshold is not None:
        return float(threshold), "given on the command line"
    finals = {label: pd.Series([r.final_pass_rate for r in rs]).mean() for label, rs in by_configuration(runs).items()}
    finals = {k: v for k, v in finals.items() if not math.isnan(v)}
    if not finals:
        return math.nan, "no run has an evaluation, so no threshold"
    best = max(finals, key=lambda k: finals[k])
    value = round(DEFAULT_FRACTION * finals[best], 3)
    return value, (f"{DEFAULT_FRACTION:.0%} of the best final mean pass rate "
                   f"({finals[best]:.3f}, {best}), rounded to 3 decimals")
