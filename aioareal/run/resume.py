"""`--resume runs/NAME`: continue an interrupted run from its latest checkpoint, as the decisions of
checkpoint/resume_plan.py say (made once, by rank 0 under torchrun)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..checkpoint.ownership import own_run_dir, release_run_dir
from ..checkpoint.resume_plan import decide, resume_config
from ..errors import UserError
from .cell import Cell, current_cell
from .recipe import train
from .sft import SFT_MARKER


def resume(run_dir: str | Path, overrides: list[str] | None = None, flags: dict[str, Any] | None = None,
           force: bool = False, log: Callable[[str], None] = print,
           printer: Callable[[dict[str, Any]], None] | None = None,
           header_fn: Callable[[], str] | None = None, cell: Cell | None = None,
           on_step: Callable[[dict[str, Any]], Any] | None = None, echo_config: bool = True) -> Path:
    run_dir = Path(run_dir)
    config = resume_config(run_dir, overrides or [], flags or {}, force)
    # Under torchrun rank 0 alone reads and tidies the run directory, and tells the others.
    cell = cell or current_cell()
    # Owned before the first look (decide tidies the directory), so a live run is never touched:
    # docs/reliability.md#run-directories.
    action, latest = cell.main_decides(lambda: _owned_decision(run_dir, config, log))
    try:
        if action == "done":
            return run_dir
        return train(config, log, printer, resume_from=latest, header_fn=header_fn, cell=cell, on_step=on_step,
                     echo_config=echo_config)
    finally:
        if cell.is_main:
            release_run_dir(run_dir)


def _owned_decision(run_dir: Path, config: Any, log: Callable[[str], None]) -> tuple[str, Path | None]:
    own_run_dir(run_dir)
    try:
        if (run_dir / SFT_MARKER).is_file():
            raise UserError(f"--resume {run_dir}: an sft run; continue it with python -m aioareal sft --resume "
                            f"{run_dir}, or start RL from it with model.name={run_dir}")
        return decide(run_dir, config.train.steps, log)
    except BaseException:
        release_run_dir(run_dir)
        raise
