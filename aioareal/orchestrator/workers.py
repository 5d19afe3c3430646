"""The generator and trainer as the orchestrator sees them: async methods over a worker thread each,
which keeps launches and host syncs off the event loop and, on the CPU, lets the two sides overlap
(torch releases the GIL in its kernels). In sync mode on the CPU both share one thread: one OpenMP
team (docs/architecture.md#threads-on-the-cpu).
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..devices import release_freed_memory
from ..errors import UserError
from ..group import Group
from ..loops import exit_unless
from ..timing import merge
from ..trainer import train_step

if TYPE_CHECKING:
    from ..generation import Engine
    from ..trainer import Trainer
    from ..weightsync.full import WeightSync


class GenerationWorker(Protocol):
    version: int
    tokens_generated: int
    phase_seconds: dict[str, float]  # running totals per phase (admit, prefill, decode, adopt, ...)

    def submit(self, group: Group) -> None: ...
    def on_work(self, wake: Callable[[], None]) -> None: ...  # call wake() when work arrives by itself (episodes)
    def free_slots(self) -> int: ...
    @property
    def busy(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    async def step(self, adopt: bool) -> list[Group]: ...


class TrainingWorker(Protocol):
    version: int

    async def train(self, groups: list[Group]) -> dict[str, float]: ...
    async def evaluate(self) -> dict[str, float]: ...


class Stalled(UserError):
    """A call into the generator's or the trainer's thread ran past run.stall_timeout_s."""


async def _on(pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any, budget: float = 0.0,
              what: str = "") -> Any:
    """`fn(*args)` on the worker thread. With a `budget` (run.stall_timeout_s) a call still running
    after it is a hang: the run stops with a one-line cause, and since a thread cannot be killed, the
    process exits (loops.EXIT_STALLED) if the call has not returned loops.CLOSE_GRACE_S later;
    `--resume` continues from the last checkpoint either way."""
    loop = asyncio.get_running_loop()
    if not budget:
        return await loop.run_in_executor(pool, fn, *args)
    done = threading.Event()

    def call() -> Any:
        try:
            return fn(*args)
        finally:
            done.set()
    future = loop.run_in_executor(pool, call)
    try:
        return await asyncio.wait_for(asyncio.shield(future), budget)
    except TimeoutError:
        cause = (f"{what} has not returned after {budget:g} s (run.stall_timeout_s): the run stops; "
                 "--resume continues from its last checkpoint")
        exit_unless(done, cause)
        raise Stalled(cause) from None


def thread_for(device: torch.device, name: str, cpu_threads: int | None = None) -> ThreadPoolExecutor:
    """One worker thread whose current CUDA device is `device` (per thread: NCCL, FSDP2 and graph
    capture must find this side's GPU, not GPU 0). On the CPU `cpu_threads` sets the width of the
    thread's own intra-op team (docs/architecture.md#threads-on-the-cpu)."""
    def pin() -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        elif cpu_threads:
            torch.set_num_threads(cpu_threads)
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=pin)


class EngineWorker:
    def __init__(self, engine: Engine, sync: WeightSync, pool: ThreadPoolExecutor | None = None,
                 stall_s: float = 0.0) -> None:
        self.engine, self.sync, self.stall_s = engine, sync, stall_s
        self.pool = pool or thread_for(engine.device, "generator")  # `pool`: a thread shared with the trainer
        self.phase_seconds: dict[str, float] = {}  # updated on the event loop's thread only

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def tokens_generated(self) -> int:
        return self.engine.tokens_generated

    @property
    def decode_tokens(self) -> int:
        return self.engine.decode_tokens

    def submit(self, group: Group) -> None:
        self.engine.submit(group)

    def on_work(self, wake: Callable[[], None]) -> None:
        """Its work arrives only through `submit`: nothing to wake for."""

    def free_slots(self) -> int:
        return len(self.engine.free) - sum(g.size for g in self.engine.waiting)

    @property
    def busy(self) -> bool:
        return self.engine.busy

    @property
    def in_flight(self) -> int:
        return len(self.engine.running)

    def _step(self, adopt: bool) -> tuple[list[Group], dict[str, float]]:
        """One generator step on its thread (adopting a version if allowed), and its phases' seconds."""
        timer = self.engine.timer
        if adopt and self.sync.pending:
            with timer("adopt"):  # staging -> live weights, on the engine's stream (no host wait)
                version, ready = self.sync.apply(self.engine.stream)
                self.engine.adopt(version, ready)
        results = self.engine.step()
        if not self.engine.busy:  # a batch done (sync, one-step): what only decoding needs goes
            self.engine.idle()
            release_freed_memory(self.engine.device)
        # After the step's host sync; an overlapped step still in flight is read by a later take().
        return results, timer.take()

    async def step(self, adopt: bool) -> list[Group]:
        results, phases = await _on(self.pool, self._step, adopt, budget=self.stall_s,
                                    what="a generator step (weight adoption, prefill, decode)")
        merge(self.phase_seconds, phases)
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class TrainerWorker:
    def __init__(self, trainer: Trainer, sync: WeightSync, evaluate: Callable[[], dict[str, float]],
                 pool: ThreadPoolExecutor | None = None, stall_s: float = 0.0) -> None:
        self.trainer, self.sync, self._evaluate, self.stall_s = trainer, sync, evaluate, stall_s
        self.pool = pool or thread_for(trainer.device, "trainer")
        self.version = trainer.version  # published version: what admission and staleness count

    async def train(self, groups: list[Group]) -> dict[str, float]:
        metrics = await _on(self.pool, self._train, groups, budget=self.stall_s,
                            what="a training step (with its weight publish)")
        self.version = self.trainer.version
        return metrics

    def _train(self, groups: list[Group]) -> dict[str, float]:
        self.sync.release()  # an unstaged sync's generator weights, rewritten by this step's publish
        try:
            metrics = train_step(self.trainer, groups, self.sync.publish)
        finally:
            self.sync.restore()
        release_freed_memory(self.trainer.device)  # the step's activations, before generation needs memory
        return metrics

    async def evaluate(self) -> dict[str, float]:
        # No budget: a held-out evaluation's length grows with eval_size (its decode steps are not timed one by one).
        return await _on(self.pool, self._evaluate_and_release)

    def _evaluate_and_release(self) -> dict[str, float]:
        metrics = self._evaluate()
        release_freed_memory(self.trainer.device)
        return metrics

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run other trainer-side work (checkpointing) on the trainer's thread."""
        return await _on(self.pool, fn, *args, budget=self.stall_s, what="a checkpoint write")

    def close(self) -> None:
        self.pool.shutdown(wait=True)
