"""What the run does with each step's report: write the rows, show them, checkpoint on schedule,
and say when the policy is collapsing or held-out reward checks failed. The hooks see plain data
(`StepReport`, `RunState`) and a few narrow callables, never the parts."""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from .. import checkpoint
from ..checkpoint import RunState
from ..evaluation.scored_completions import failures_line
from ..orchestrator import StepReport

SaveCheckpoint = Callable[[RunState], Awaitable[None]]


class CollapseWatch:
    """One line, once each, when a step's entropy falls below ENTROPY_FRACTION of what it was WINDOW
    steps before (a cliff, not RL's slow narrowing) while its training reward did not rise, or the
    held-out score below half its best (by at least SCORE_DROP): the signs of a policy collapsing
    (Gemma 3 270M at lr 1e-5: entropy 2.6 -> 0.6 nats and held-out 0.25 -> 0.02 in ten steps), said
    while the run can still be stopped with its last good checkpoint. A cliff with the reward up by
    REWARD_RISE is a policy settling on what pays (the calculator run: entropy 2.3 -> 0.5 nats while
    its held-out rate goes 0 -> 0.85), so it is not said."""

    ENTROPY_FRACTION, WINDOW, MIN_ENTROPY = 0.3, 10, 0.1
    SCORE_DROP, REWARD_RISE = 0.1, 0.05

    def __init__(self) -> None:
        self.entropies: deque[float] = deque(maxlen=self.WINDOW + 1)
        self.rewards: deque[float | None] = deque(maxlen=self.WINDOW + 1)  # beside entropies, step for step
        self.best_score: float | None = None
        self.said: set[str] = set()

    def see(self, row: dict[str, Any]) -> list[str]:
        lines = []
        entropy, score, step = row.get("entropy"), row.get("eval_pass_rate"), row.get("step")
        if _finite(entropy):
            self.entropies.append(float(entropy))
            reward = row.get("reward_mean")
            self.rewards.append(float(reward) if _finite(reward) else None)
            before, reward_before = self.entropies[0], self.rewards[0]
            rising = reward_before is not None and self.rewards[-1] is not None and \
                self.rewards[-1] >= reward_before + self.REWARD_RISE
            if before > self.MIN_ENTROPY and entropy < self.ENTROPY_FRACTION * before and not rising:
                lines += self._once("entropy", f"step {step}: entropy {entropy:.2f} nats, {entropy / before:.0%} "
                                               f"of its {before:.2f} {len(self.entropies) - 1} steps before")
        if _finite(score):
            best = self.best_score
            if best is not None and score < best / 2 and best - score >= self.SCORE_DROP:
                lines += self._once("score", f"step {step}: held-out score {score:.3f}, down from its best "
                                             f"{best:.3f}")
            self.best_score = score if best is None else max(best, score)
        return lines

    def _once(self, kind: str, what: str) -> list[str]:
        if kind in self.said:
            return []
        self.said.add(kind)
        return [f"warning: {what}: the policy may be collapsing; stop the run (Ctrl-C keeps a checkpoint) and "
                "lower algo.lr or algo.embedding_lr_scale (docs/models.md#gemma-3-270m)"]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class RunHooks:
    def __init__(self, write_row: Callable[[dict[str, Any]], None],
                 write_samples: Callable[[list[dict[str, Any]]], None], show: Callable[[StepReport], None],
                 save: SaveCheckpoint, checkpoint_every: int, steps: int, start_step: int = 0,
                 warn: Callable[[str], None] = print) -> None:
        self.write_row, self.write_samples, self.show, self.save = write_row, write_samples, show, save
        self.checkpoint_every, self.steps = checkpoint_every, steps
        self.last_checkpoint = start_step
        self.warn, self.collapse = warn, CollapseWatch()

    async def on_step(self, report: StepReport) -> None:
        self.write_row(report.row)
        self.write_samples(report.samples)
        self.show(report)
        for line in self.collapse.see(report.row):
            self.warn(line)
        if failed := report.row.get("eval_reward_failures"):  # also counted in the row; said where it is seen
            self.warn(failures_line(f"held-out evaluation at step {report.step:d}", int(failed)))
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
