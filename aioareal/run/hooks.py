"""What the run does with each step's report: write the rows, show them, checkpoint on schedule.
The hooks see plain data (`StepReport`, `RunState`) and a few narrow callables, never the parts."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .. import checkpoint
from ..checkpoint import RunState
from ..orchestrator import StepReport

SaveCheckpoint = Callable[[RunState], Awaitable[None]]


class RunHooks:
    def __init__(self, write_row: Callable[[dict[str, Any]], None],
                 write_samples: Callable[[list[dict[str, Any]]], None], show: Callable[[StepReport], None],
                 save: SaveCheckpoint, checkpoint_every: int, steps: int, start_step: int = 0) -> None:
        self.write_row, self.write_samples, self.show, self.save = write_row, write_samples, show, save
        self.checkpoint_every, self.steps = checkpoint_every, steps
        self.last_checkpoint = start_step

    async def on_step(self, report: StepReport) -> None:
        self.write_row(report.row)
        self.write_samples(report.samples)
        self.show(report)
        step, every = report.step, self.checkpoint_every
        if report.groups and ((every and step % every == 0) or step == self.steps):
            await self._save(report.state)

    async def on_stop(self, state: RunState) -> None:
        """A requested stop (Ctrl-C, SIGTERM) ends after a finished step: keep it."""
        if state.step != self.last_checkpoint:
            await self._save(state)

    async def _save(self, state: RunState) -> None:
        await self.save(state)
        self.last_checkpoint = state.step


def checkpoint_saver(run_dir: Any, trainer_worker: Any, engine_generator: Any, tokenizer: Any,
                     keep: int) -> SaveCheckpoint:
    """Save a checkpoint of `state`: files written on the trainer's thread, where no update can
    change the weights meanwhile (`trainer_worker.call`)."""
    async def save(state: RunState) -> None:
        # The random states are read here, on the loop thread, before anything can await: once
        # this coroutine yields, the generator may start the next batch and draw from the sampling
        # RNG, and a resumed run would then sample differently from an unbroken one.
        rng = checkpoint.rng_state(engine_generator)
        trainer = trainer_worker.trainer

        def write() -> None:
            checkpoint.save(run_dir, state, trainer.model, tokenizer, trainer.state_dict(), rng, keep)

        await trainer_worker.call(write)
    return save
