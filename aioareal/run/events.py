"""The run's event loop and what reaches the terminal: uvloop when installed, the stop signals
(Ctrl-C, SIGTERM), and the plain per-step lines.

Called where an event loop already runs on this thread (Jupyter, IPython, an application's loop),
the run's loop runs on a thread of its own (loops.py). The signal handlers then cannot be
installed (they belong to the main thread's loop), so the waiting thread turns Ctrl-C (a
notebook's interrupt) into the same request: finish the step, checkpoint, return.

What the run does with each step's report: write the rows, show them, checkpoint on schedule,
and say when the policy is collapsing or held-out reward checks failed. The hooks see plain data
(`StepReport`, `RunState`) and a few narrow callables, never the parts.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

from .. import checkpoint
from ..checkpoint import RunState
from ..errors import one_line
from ..evaluation.scored_completions import failures_line
from ..loops import exit_stalled, run_coroutine
from ..monitor.dashboard import plain_line
from ..orchestrator import StepReport

DUPLICATE_S = 0.1  # a second signal sooner than this is a duplicate delivery, not a second Ctrl-C
_interruptible: list[tuple[asyncio.AbstractEventLoop, Stoppable]] = []  # runs on a loop of their own thread
_pending: list[int] = []  # a Ctrl-C that came before the run's loop could take it


class Stoppable(Protocol):
    stop_requested: bool

    def request_stop(self, signum: int = 2) -> None: ...


def _say(signum: int, what: str) -> None:
    """A line on stderr about signal `signum`, after a newline (the terminal echoed ^C on the current one)."""
    print("\n" + one_line(f"{signal.Signals(signum).name}: {what}"), file=sys.stderr, flush=True)


@contextlib.contextmanager
def stop_signals(target: Stoppable) -> Iterator[None]:
    """First Ctrl-C / SIGTERM: finish the current step, checkpoint, exit cleanly. Second: exit now.
    `target` is the orchestrator, or under torchrun the rank's hooks, which stop every rank after one
    step (the cell says which). The handlers go when the block ends: the loop keeps what it is given,
    and a handler left behind would keep this run's models alive into the next run of a sweep."""
    loop = asyncio.get_running_loop()

    first: dict[int, float] = {}

    def stop(signum: int) -> None:
        now = time.monotonic()
        if now - first.get(signum, -math.inf) < DUPLICATE_S:
            return  # the same signal twice at once: `timeout` sends it to the process and to its group
        first.setdefault(signum, now)
        if target.stop_requested:
            # Immediate exit is safe: checkpoints are renamed into place and metrics lines are
            # single appends that a resume repairs.
            print("exiting now", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        _say(signum, "finishing the current step and checkpointing (press Ctrl-C again to exit at once)")
        target.request_stop(signum)

    installed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop, signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (uvloop: ValueError)
            break
        installed.append(signum)
    entry = (loop, target)
    if not installed:
        _interruptible.append(entry)  # the thread waiting in run_event_loop forwards Ctrl-C
        if _pending:
            target.request_stop(_pending.pop())
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
        if entry in _interruptible:
            _interruptible.remove(entry)


def request_stops(signum: int = signal.SIGINT) -> None:
    """Ask every run whose loop has no signal handlers to stop after its step (one still starting
    stops after its first)."""
    if not _interruptible:
        _say(signum, "the run stops after its first step")
        _pending[:] = [signum]
    for loop, target in list(_interruptible):
        if not target.stop_requested:
            _say(signum, "finishing the current step and checkpointing")
        loop.call_soon_threadsafe(target.request_stop, signum)


def run_event_loop(coro: Any) -> Any:
    """The run's coroutine to completion (loops.py: beside a notebook's loop on a thread of its own,
    where Ctrl-C becomes `request_stops`)."""
    _pending.clear()
    return run_coroutine(coro, on_interrupt=request_stops)


class LoopLag:
    """How late the run's event loop wakes a coroutine that sleeps TICK_S: the worst since the last
    `take`, logged as `loop_lag_max` in each step's row. A loop blocked by work that belongs on a
    thread (a reward function's, a checkpoint's) stalls generation, training and Ctrl-C alike; the
    row names the step where it happened. Blocked for longer than `stall_s` (run.stall_timeout_s)
    it is hung: `watchdog`, a thread, says so in one line and ends the process, since nothing on
    the loop can run to stop it (checkpoints and metrics are atomic: --resume continues)."""

    TICK_S = 0.05

    def __init__(self, stall_s: float = 0.0, exit: Callable[[str], None] | None = None) -> None:
        self.worst, self.stall_s = 0.0, stall_s
        self.last_tick = time.monotonic()
        self.exit = exit or exit_stalled

    async def watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            self.last_tick = time.monotonic()
            await asyncio.sleep(self.TICK_S)
            self.worst = max(self.worst, loop.time() - start - self.TICK_S)

    @contextlib.contextmanager
    def watchdog(self) -> Iterator[None]:
        if not self.stall_s:
            yield
            return
        self.last_tick = time.monotonic()
        done = threading.Event()

        def check() -> None:
            while not done.wait(min(1.0, self.stall_s / 4)):
                blocked = time.monotonic() - self.last_tick
                if blocked > self.stall_s:
                    self.exit(f"the event loop has been blocked for {blocked:.0f} s (run.stall_timeout_s="
                              f"{self.stall_s:g}): code on it that belongs on a thread (a reward function, "
                              "an episode, an on_step callback) never returned; --resume continues from the "
                              "last checkpoint")
                    return
        thread = threading.Thread(target=check, name="loop-watchdog", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return round(worst, 4)


def quiet(*_: Any) -> None:
    pass


def step_printer(log: Callable[[str], None], steps: int, evals_only: bool) -> Callable[[dict[str, Any]], None]:
    """One plain line per step; above a dashboard (which shows the rest) only evaluation steps."""
    def print_row(row: dict[str, Any]) -> None:
        if not evals_only or row.get("eval_pass_rate") is not None:
            log(plain_line(row, steps))
    return print_row


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
