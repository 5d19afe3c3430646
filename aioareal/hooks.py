"""What happens around each training step: write the rows, feed the live view, checkpoint."""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable

from . import checkpoint
from .samples import Group

if TYPE_CHECKING:
    from .orchestrator import Orchestrator
    from .run import Parts


class RunHooks:
    def __init__(self, parts: "Parts", orchestrator: "Orchestrator",
                 printer: Callable[[dict[str, Any]], None]) -> None:
        self.parts, self.o, self.printer = parts, orchestrator, printer
        self.last_checkpoint = parts.start_step

    async def on_eval(self, step: int, row: dict[str, Any]) -> None:
        self.parts.log.step(row)
        if self.parts.live is not None:
            self.parts.live.record(row)
        self.printer(row)

    async def on_step(self, step: int, row: dict[str, Any], groups: list[Group]) -> None:
        samples = self.o.sample_rows(step, groups)
        self.parts.log.step(row)
        self.parts.log.samples(samples)
        if self.parts.live is not None:
            self.parts.live.record(row, [s["staleness"] for s in samples])
        self.printer(row)
        every, steps = self.parts.config.run.checkpoint_every, self.parts.config.train.steps
        if (every and step % every == 0) or step == steps:
            await self.save(step)

    async def on_stop(self, step: int) -> None:
        """A requested stop (Ctrl-C, SIGTERM) ends after a finished step: keep it."""
        if step != self.last_checkpoint:
            await self.save(step)

    async def save(self, step: int) -> None:
        # The counters and random states are read here, on the loop thread, before anything can
        # await: once this coroutine yields, the generator may start the next batch and draw from
        # the sampling RNG, and a resumed run would then sample differently from an unbroken one.
        # The files are written on the trainer's thread, where no update can change the weights.
        state = checkpoint.RunState(step=step, cursor=self.o.resume_cursor(), elapsed=self.o.now(),
                                    ledger=asdict(self.o.ledger), reward_failures=self.o.reward_failures)
        parts = self.parts
        trainer = parts.trainer.trainer
        rng = checkpoint.rng_state(parts.engine.generator)

        def write() -> None:
            checkpoint.save(parts.run_dir, state, trainer.model, parts.tokenizer, trainer.state_dict(),
                            rng, parts.config.run.keep_checkpoints)

        await parts.trainer.call(write)
        self.last_checkpoint = step

