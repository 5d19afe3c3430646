"""`aioareal.train`: a run from Python, through the command line's own path (`run_training`, which
cli.py calls too): keyword arguments are flags, `settings` any `section.key`, data objects become
files in the run directory (data.py), callables become registered names (usercode.register)."""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..config.layering import TRL_NAMES
from ..errors import RunStopped, UserError
from ..usercode import register
from .data import data_file, remove_written
from .run import Run

# TRL's GRPOConfig names taken as keyword arguments: the one-to-one ones (config/layering.py TRL_NAMES).
SPARSE_EVERY = 10  # progress="auto" off a terminal: a line every this many steps
TRL_ALIASES = {name: key for name, key in TRL_NAMES.items() if " " not in key and name != "scale_rewards"}


def train(model: str | None = None, train_dataset: Any = None, reward_funcs: Sequence[Callable[..., Any] | str]
          | Callable[..., Any] | None = None, *, eval_dataset: Any = None, config: str | Path | None = None,
          mode: str | None = None, max_staleness: int | None = None, objective: str | None = None,
          steps: int | None = None, seed: int | None = None, run_dir: str | Path | None = None,
          resume: str | Path | Run | None = None, force: bool = False, settings: dict[str, Any] | None = None,
          on_step: Callable[[dict[str, Any]], Any] | None = None, progress: str = "auto", **keys: Any) -> Run:
    """Train (or, with `resume`, continue) a run and return it. `model`: a name (tiny,
    smollm2-135m-instruct, gemma3-270m), a directory, a .gguf or a run directory. `train_dataset` /
    `eval_dataset`: a Dataset, a DataFrame, a list of dicts or a file path. `reward_funcs`: TRL's
    `fn(completions, **columns) -> list[float]` callables or import paths. `settings`:
    {"algo.lr": 1e-5, ...}; `**keys`: a section as a dict or config object (algo={"lr": 1e-5}) or a
    TRL GRPOConfig name (learning_rate=1e-5, num_generations=8). `progress`: auto (the dashboard
    on a terminal, else a line every 10 steps and at evaluations), lines (every step), or off. A
    run stopped by `on_step` or an interrupt comes back with `stopped` set; pass it as `resume` to
    continue."""
    flags = _flags(model, mode, max_staleness, objective, steps, seed, settings, keys)
    specs = reward_specs(reward_funcs)
    printer = _printer(progress)
    if resume is not None:
        if train_dataset is not None or eval_dataset is not None:
            raise UserError(f"resume={resume}: a resumed run trains on the data it started with "
                            f"({Path(str(resume)) / 'data'}); drop train_dataset and eval_dataset")
        target = Path(str(resume.run_dir if isinstance(resume, Run) else resume))
        return _trained(lambda: run_training(None, target, flags, force, printer, on_step, echo_config=False),
                        target)
    if specs:
        flags["reward.functions"] = specs
    return _fresh(config, flags, train_dataset, eval_dataset, run_dir, printer, on_step)


def _fresh(config: str | Path | None, flags: dict[str, Any], train_dataset: Any, eval_dataset: Any,
           run_dir: str | Path | None, printer: Any, on_step: Any) -> Run:
    from ..config import load_config
    from ..run.early_checks import check_before_loading
    from ..run.recipe import default_run_dir

    directory = Path(run_dir) if run_dir is not None else default_run_dir(load_config(config, [], flags))
    flags["run.run_dir"] = str(directory)
    written: list[Path] = []
    try:
        for split, data in (("train", train_dataset), ("eval", eval_dataset)):
            if data is not None:
                path = data_file(data, directory, split, written)
                flags["data.path" if split == "train" else "data.eval_path"] = path
        if train_dataset is not None and "data.task" not in flags:
            flags["data.task"] = "file"
        resolved = load_config(config, [], flags)
        check_before_loading(resolved)
        return _trained(lambda: run_training(resolved, None, {}, False, printer, on_step, echo_config=False),
                        directory)
    except BaseException:
        if not (directory / "metrics.jsonl").exists() and not any(directory.glob("checkpoints/step-*")):
            remove_written(written)  # the run never started: no data files left behind as a husk
        raise


def run_training(config: Any, resume_target: Path | None, flags: dict[str, Any], force: bool = False,
                 printer: Callable[[dict[str, Any]], None] | None = None,
                 on_step: Callable[[dict[str, Any]], Any] | None = None, overrides: Sequence[str] = (),
                 echo_config: bool = True) -> Path:
    """Train `config`, or continue `resume_target` under its own config with `overrides` and
    `flags`, in the job's session (one process, or a torchrun rank's cell): the one path of both
    the command line and `train`."""
    from ..checkpoint.resume_plan import resume_config
    from ..run.cell import cell_for, session
    from ..run.events import quiet
    from ..run.recipe import resume
    from ..run.recipe import train as train_run

    if config is None:
        config = resume_config(resume_target, list(overrides), flags, force)
    with session(config) as world:
        cell = cell_for(world)
        if resume_target is not None:
            return resume(resume_target, list(overrides), flags, force, log=print if cell.is_main else quiet,
                          printer=printer, cell=cell, on_step=on_step, echo_config=echo_config)
        return train_run(config, printer=printer, cell=cell, on_step=on_step, echo_config=echo_config)


def _trained(work: Callable[[], Path], run_dir: Path) -> Run:
    try:
        return Run(work())
    except RunStopped as e:
        print(str(e).replace(f"python -m aioareal --resume {run_dir}", f"aioareal.train(resume='{run_dir}')"))
        return Run(run_dir, stopped=True)


def reward_specs(funcs: Sequence[Callable[..., Any] | str] | Callable[..., Any] | None) -> list[str]:
    """Import paths as given; callables registered under their own name ('python:exact'), or
    `reward_N` (N: the position) for a lambda, so the same list names the same functions again."""
    if funcs is None:
        return []
    if callable(funcs) or isinstance(funcs, str):
        funcs = [funcs]
    specs, names = [], set()
    for i, fn in enumerate(funcs):
        if isinstance(fn, str):
            specs.append(fn)
            continue
        if not callable(fn):
            raise UserError(f"reward_funcs[{i}] is a {type(fn).__name__}, expected a function "
                            "fn(completions, **kwargs) -> list[float] or an import path 'module:function'")
        name = getattr(fn, "__name__", "")
        name = name if name.isidentifier() and name not in names else f"reward_{i}"
        names.add(name)
        specs.append(register(fn, name))
    return specs


def _flags(model: str | None, mode: str | None, max_staleness: int | None, objective: str | None,
           steps: int | None, seed: int | None, settings: dict[str, Any] | None,
           keys: dict[str, Any]) -> dict[str, Any]:
    flags: dict[str, Any] = {"model.name": model, "rollout.mode": mode, "rollout.max_staleness": max_staleness,
                             "algo.objective": objective, "train.steps": steps, "run.seed": seed}
    for name, value in keys.items():
        if name in TRL_ALIASES:
            flags[TRL_ALIASES[name]] = value
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            flags.update({f"{name}.{k}": v for k, v in dataclasses.asdict(value).items()})
        elif isinstance(value, dict):
            flags.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            raise UserError(f"train(): keyword '{name}' is neither a config section given as a dict (algo={{'lr': "
                            "1e-5}}) nor a TRL GRPOConfig name; any key goes in settings={'section.key': value}")
    for key, value in (settings or {}).items():
        if not isinstance(key, str) or "." not in key:
            raise UserError(f"settings: key {key!r} is not 'section.key' (for example 'algo.lr')")
        flags[key] = value
    return {k: v for k, v in flags.items() if v is not None}


def _printer(progress: str) -> Callable[[dict[str, Any]], None] | None:
    """auto: the run's own dashboard on a terminal; elsewhere (a notebook, a log) a line every
    SPARSE_EVERY steps and at each evaluation, which a cell's output can hold."""
    from ..monitor.dashboard import plain_line

    def sparse(row: dict[str, Any]) -> None:
        if row.get("step", 0) % SPARSE_EVERY == 0 or row.get("eval_pass_rate") is not None:
            print(plain_line(row), flush=True)

    if progress == "auto":
        return None if sys.stdout.isatty() else sparse
    if progress == "off":
        return lambda row: None
    if progress == "lines":
        return lambda row: print(plain_line(row), flush=True)
    raise UserError(f"progress={progress!r}: expected 'auto', 'lines' or 'off'")
