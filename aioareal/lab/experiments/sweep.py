"""`python -m aioareal sweep configs/sweeps/NAME.yaml`: a grid of runs over a base config.

    name: staleness-tiny          # runs go to runs/<name>/<run>/
    base: ../tiny-arith.yaml      # optional, relative to this file
    set: {train.steps: 120}       # applied to every run
    cases:                        # explicit configurations (keys that must change together)
      - {rollout.mode: sync}
      - {rollout.mode: async, rollout.max_staleness: 4}
    grid: {algo.objective: [ppo, dg]}   # cartesian product with the cases
    seeds: [0, 1]

Runs execute one after another in this process (the design is one process, one event loop).
Re-running a sweep skips finished runs (a DONE file), resumes unfinished ones from their latest
checkpoint and starts the rest, so an interrupted sweep ends with exactly the runs and steps it
would have had.
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import checkpoint
from ...checkpoint import is_done
from ...config import Config, load_config
from ...config.layering import load_yaml
from ...errors import DataError, UserError, one_line

SHORT = {"rollout.mode": "mode", "rollout.max_staleness": "K", "algo.objective": "obj", "run.seed": "seed"}
ORDER = {key: i for i, key in enumerate(SHORT)}  # names read mode, K, objective, ..., seed
SPEC_KEYS = {"name", "base", "set", "cases", "grid", "seeds"}
MAX_RUNS = 10_000  # each run is a directory and at least minutes of compute: beyond this it is a mistake
SKIP = "skipped: no readable checkpoint"


class SweepIncomplete(UserError):
    """Every run that could go on did; these could not (named in the message)."""

    def __init__(self, message: str, sweep_dir: Path) -> None:
        super().__init__(message)
        self.sweep_dir = sweep_dir


@dataclass
class PlannedRun:
    name: str
    run_dir: Path
    config: Config
    values: dict[str, Any]  # the keys this run sets beyond the base

    @property
    def status(self) -> str:
        return self.inspect()[0]

    def inspect(self) -> tuple[str, str]:
        """(status, what was wrong): a checkpoint whose state.json does not read (cut, edited, not
        ours to read) is named, never a traceback that stops the sweep; the resume skips it for the
        one before, and a run with no readable checkpoint at all is skipped (SKIP), left as it is."""
        if is_done(self.run_dir):
            return "done", ""
        wrong = ""
        for path in reversed(checkpoint.list_checkpoints(self.run_dir)):
            try:
                return f"resume from step {checkpoint.load_state(path).step}", wrong
            except DataError as e:
                wrong = wrong or one_line(e)
        if wrong:
            return SKIP, wrong
        return "restart" if (self.run_dir / "config.yaml").exists() else "new", ""


def read_spec(path: Path) -> dict[str, Any]:
    """The sweep file, every key checked for its shape (sweep files are data, read with bounds)."""
    if not path.is_file():
        raise UserError(f"sweep file not found: {path}")
    spec = load_yaml(path) or {}  # aliases and depth bounded: docs/reliability.md#bounded-readers
    if not isinstance(spec, dict):
        raise UserError(f"{path}: expected a mapping with name, base, set, cases, grid, seeds")
    unknown = set(map(str, spec)) - SPEC_KEYS
    if unknown:
        raise UserError(f"{path}: unknown sweep key(s) {', '.join(sorted(unknown))} "
                        f"(expected {', '.join(sorted(SPEC_KEYS))})")
    for key, ok, expected in _shapes(spec):
        if key in spec and spec[key] is not None and not ok(spec[key]):
            raise UserError(f"{path}: '{key}' must be {expected}, got {spec[key]!r}")
    return spec


def _keyed(x: Any) -> bool:
    return isinstance(x, dict) and all(isinstance(k, str) for k in x)


def _shapes(spec: dict[str, Any]) -> list[tuple[str, Callable[[Any], bool], str]]:
    name_ok = lambda v: isinstance(v, str) and v.strip(". ") != "" and one_line(v) == v and "/" not in v  # noqa: E731
    return [("name", name_ok, "a plain directory name (no '/', no control characters)"),
            ("base", lambda v: isinstance(v, str), "a config file path, relative to the sweep file"),
            ("set", _keyed, "a mapping of config keys to values"),
            ("cases", lambda v: isinstance(v, list) and all(_keyed(c) for c in v),
             "a list of mappings of config keys to values"),
            ("grid", lambda v: _keyed(v) and all(isinstance(x, list) and x for x in v.values()),
             "a mapping of config keys to non-empty lists of values"),
            ("seeds", lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                            for x in v), "a list of integers")]


def _label(values: dict[str, Any], varying: list[str]) -> str:
    parts = [f"{SHORT.get(k, k.split('.')[-1])}={values[k]}" for k in varying if k in values]
    return one_line("_".join(parts)).replace("/", "-").replace("\\", "-") or "run"


def plan(path: str | Path, runs_root: str | Path = "runs") -> tuple[str, list[PlannedRun]]:
    """Every run of the sweep with its validated config (an invalid point fails before any runs)."""
    path = Path(path)
    spec = read_spec(path)
    name = spec.get("name") or path.stem
    base = (path.parent / spec["base"]) if spec.get("base") else None
    cases = spec.get("cases") or [{}]
    grid = spec.get("grid") or {}
    seeds = spec.get("seeds") or [0]
    count = len(cases) * math.prod(len(values) for values in grid.values()) * len(seeds)
    if count > MAX_RUNS:  # counted before anything is expanded: a grid of 10^9 points is one line, not a MemoryError
        raise UserError(f"{path}: {count} runs (cases x grid x seeds), more than a sweep holds (at most {MAX_RUNS}); "
                        "split it into several sweep files")
    points = []
    for case, combo, seed in itertools.product(cases, itertools.product(*grid.values()), seeds):
        points.append({**case, **dict(zip(grid, combo)), "run.seed": seed})
    keys = sorted(dict.fromkeys(k for p in points for k in p), key=lambda k: ORDER.get(k, len(ORDER) - 1.5))
    varying = [k for k in keys if len({repr(p.get(k)) for p in points}) > 1]
    runs, seen = [], set()
    for values in points:
        run_name = _label(values, varying)
        if run_name in seen:
            raise UserError(f"{path}: two runs would share the name '{run_name}' (duplicate grid points?)")
        seen.add(run_name)
        run_dir = Path(runs_root) / name / run_name
        check_name_fits(path, run_name, run_dir)
        flags = {**(spec.get("set") or {}), **values, "run.run_dir": str(run_dir)}
        try:
            config = load_config(base, flags=flags)
        except UserError as e:
            raise UserError(f"{path}: run '{run_name}': {e}") from None
        runs.append(PlannedRun(run_name, run_dir, config, values))
    return name, runs


NAME_MAX, PATH_MAX = 255, 4096  # bytes: Linux's and macOS's limits on one name and on a whole path


def check_name_fits(path: Path, run_name: str, run_dir: Path) -> None:
    """A run directory's name the file system can create, checked when the plan is made: a name past
    NAME_MAX bytes failed only when its run came, after the runs before it had trained."""
    for part in (run_name, run_dir.parent.name):
        if len(part.encode()) > NAME_MAX:
            raise UserError(f"{path}: run directory name '{part[:60]}...' is {len(part.encode())} bytes, past the "
                            f"file system's {NAME_MAX}; shorten the sweep's name or the values its grid varies")
    if len(str(run_dir.resolve()).encode()) > PATH_MAX:
        raise UserError(f"{path}: run directory {str(run_dir)[:60]}... is longer than the {PATH_MAX} bytes a path "
                        "may have")


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N): this process runs every N-th run of the plan, starting at run I (0-based)."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise UserError(f"--shard: expected I/N with 0 <= I < N (e.g. 0/2), got {text!r}")
    return int(index), int(count)


def shard_of(runs: list[PlannedRun], shard: tuple[int, int]) -> list[PlannedRun]:
    """The runs of one shard: N processes with shards 0/N .. N-1/N share a sweep without overlap
    (one process runs one run at a time, docs/architecture.md#data-flow; more cores, more processes)."""
    index, count = shard
    return runs[index::count]


def run_sweep(path: str | Path, runs_root: str | Path = "runs", log: Callable[[str], None] = print,
              dashboard: str | None = None, shard: tuple[int, int] = (0, 1)) -> Path:
    from ...run.recipe import resume, train

    name, runs = plan(path, runs_root)
    runs = shard_of(runs, shard)
    started, skipped = time.monotonic(), []
    for i, run in enumerate(runs, 1):
        status, wrong = run.inspect()
        header = f"sweep {name}: run {i}/{len(runs)} {run.name} ({status}) · elapsed {_hms(time.monotonic() - started)}"
        log(header)
        if wrong:
            log(one_line(f"warning: {wrong}" + ("; fix or remove it to continue the run, the sweep goes on"
                                                if status == SKIP else "; resuming from the one before it")))
        if status == SKIP:
            skipped.append(run.name)
        if status in ("done", SKIP):
            continue
        config = run.config
        if dashboard:
            config.run.dashboard = dashboard
        progress = lambda i=i, run=run: (f"sweep {name} · run {i}/{len(runs)} {run.name} · "  # noqa: E731
                                         f"elapsed {_hms(time.monotonic() - started)}")
        if status == "new":
            train(config, log=log, header_fn=progress)
        else:
            overrides = {"run.dashboard": config.run.dashboard} if dashboard else {}
            resume(run.run_dir, flags=overrides, log=log, header_fn=progress)
    log(f"sweep {name}: {len(runs)} runs in {Path(runs_root) / name}")
    if skipped:
        raise SweepIncomplete(f"sweep {name}: {len(skipped)} of {len(runs)} runs skipped, no checkpoint of theirs "
                              f"reads back: {', '.join(skipped)}", Path(runs_root) / name)
    return Path(runs_root) / name


def _hms(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"
