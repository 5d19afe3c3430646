"""`--resume runs/NAME`: every decision of a resume. Which run (`resume_target`), which config
(`resume_config`), which checkpoint (`decide`: `latest_readable`, never past broken ones), or none
(start over), or nothing to do (the run had finished); run/recipe.py's `resume` then trains from the chosen
checkpoint, which the cell restores.

The run's saved config is the base; flags and overrides may extend it (more `train.steps`, another
display), but a change to anything that shapes the training itself is refused unless forced: a
resumed run that silently trains under a different config is not the run it claims to be.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Config, load_config, to_dict
from ..errors import UserError
from . import atomic as checkpoint

# Keys a resume may change without --force: they do not change what is being trained (a sharded
# checkpoint reshards to another number of ranks, whose count config.yaml only records).
SAFE_TO_CHANGE = {"train.steps", "run.dashboard", "run.checkpoint_every", "run.keep_checkpoints", "eval.every",
                  "reward.workers", "reward.isolation", "run.run_dir", "dist.timeout_s", "dist.backend",
                  "dist.world_size", "run.trackers", "run.tracker_project", "run.wandb_mode",
                  "sft.steps", "sft.eval_every"}
AUTO = "auto"  # --resume auto --run-dir DIR: continue DIR if it holds a run, else start it


def resume_target(resume: str | None, run_dir: str | None, config_file: str | None) -> Path | None:
    """The run directory `--resume` continues, or None for a fresh run. `--resume auto` (for
    torchrun --max-restarts, which re-runs the same command) resumes `--run-dir` when it holds a
    run and starts it otherwise; every rank sees the same files here, as no rank writes before all
    have joined the job."""
    if resume is None:
        return None
    if resume == AUTO:
        if not run_dir:
            raise UserError("--resume auto needs --run-dir: the run to continue if it exists, else to start")
        return Path(run_dir) if (Path(run_dir) / "config.yaml").is_file() else None
    if config_file:
        raise UserError("--resume uses the run's own config.yaml; drop --config (overrides are allowed)")
    return Path(resume)


def check_unchanged(saved: Config, given: Config, force: bool) -> None:
    """`--resume auto` with --config: the file must not have changed what the run trains."""
    risky = [k for k in changed_keys(saved, given) if k not in SAFE_TO_CHANGE]
    if risky and not force:
        raise UserError(f"--resume auto: --config differs from the run's config.yaml in {', '.join(risky)}; "
                        "pass --force to resume under the run's own config anyway")


def changed_keys(before: Config, after: Config) -> list[str]:
    a, b = to_dict(before), to_dict(after)
    return [f"{section}.{key}" for section in a for key in a[section] if a[section][key] != b[section][key]]


def resume_config(run_dir: Path, overrides: list[str], flags: dict[str, Any], force: bool) -> Config:
    saved_path = run_dir / "config.yaml"
    if not run_dir.is_dir() or not saved_path.is_file():
        raise UserError(f"--resume {run_dir}: not a run directory (no config.yaml inside)")
    saved = load_config(saved_path)
    config = load_config(saved_path, overrides, {**flags, "run.run_dir": str(run_dir)})
    risky = [k for k in changed_keys(saved, config) if k not in SAFE_TO_CHANGE]
    if risky and not force:
        raise UserError(f"--resume {run_dir}: the config differs from the run's in {', '.join(risky)}; "
                        "pass --force to resume under the new config anyway")
    return config


def decide(run_dir: Path, steps: int, log: Callable[[str], None]) -> tuple[str, Path | None]:
    """("resume", checkpoint), ("fresh", None) after clearing the outputs, or ("done", None): the
    run had reached `steps` (train.steps)."""
    latest = checkpoint.latest_readable(run_dir, log)
    if latest is None and checkpoint.broken_checkpoints(run_dir):  # never "start over" past broken ones
        raise UserError(f"{run_dir}: no checkpoint under {checkpoint.checkpoint_dir(run_dir)} reads back (each is "
                        "kept as broken-step-N); metrics and samples were left as they are")
    if latest is None:
        log(f"{run_dir}: no checkpoint yet, starting it over")
        for name in ("metrics.jsonl", "samples.jsonl"):
            (run_dir / name).unlink(missing_ok=True)
        return "fresh", None
    step = checkpoint.load_state(latest).step
    if step >= steps:
        # Killed between the last checkpoint and DONE: the run is complete, say so for next time.
        checkpoint.mark_done(run_dir, step)
        log(f"{run_dir}: already finished ({step} steps)")
        return "done", None
    checkpoint.clear_done(run_dir)
    return "resume", latest
