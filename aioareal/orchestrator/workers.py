"""The generator and trainer as the orchestrator sees them: async methods over a worker thread.

Each side runs its torch calls on one dedicated thread. On the GPU that keeps kernel launches and
the one host sync per decode step off the event loop; on the CPU, where torch ops run
synchronously, it is what lets generation and training overlap at all (torch releases the GIL
inside its kernels). In sync mode on the CPU, where they take turns, both sides share one thread
instead: one OpenMP team in the process (docs/architecture.md#threads-on-the-cpu). The event
loop itself only does bookkeeping.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..devices import release_freed_memory
from ..group import Group
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


async def _on(pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


def thread_for(device: torch.device, name: str, cpu_threads: int | None = None) -> ThreadPoolExecutor:
    """One worker thread whose current CUDA device is `device`: the current device is per thread,
    and code that takes the current stream or device (NCCL, FSDP2, graph capture) must find this
    side's GPU, not GPU 0, when a torchrun rank's cell sits on other GPUs. On the CPU,
    `cpu_threads` sets the width of the thread's own intra-op team (torch's threads are per
    thread: one that leads no team elsewhere, docs/architecture.md#threads-on-the-cpu)."""
    def pin() -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        elif cpu_threads:
            torch.set_num_threads(cpu_threads)
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=pin)


class EngineWorker:
    def __init__(self, engine: Engine, sync: WeightSync, pool: ThreadPoolExecutor | None = None) -> None:
        self.engine, self.sync = engine, sync
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
        """One generator step on its thread: adopt a published version if allowed, then the
        engine's admit, prefill, decode, sync and bookkeeping; returns the phases' seconds too."""
        timer = self.engine.timer
        if adopt and self.sync.pending:
            with timer("adopt"):  # staging -> live weights, on the engine's stream (no host wait)
                version, ready = self.sync.apply(self.engine.stream)
                self.engine.adopt(version, ready)
        results = self.engine.step()
        if not self.engine.busy:  # a batch done (sync, one-step): what only decoding needs goes
            self.engine.idle()
            release_freed_memory(self.engine.device)
        # After the step's host sync: the timings are ready, but for an overlapped engine's step
        # still in flight, which a later take() reads.
        return results, timer.take()

    async def step(self, adopt: bool) -> list[Group]:
        results, phases = await _on(self.pool, self._step, adopt)
        merge(self.phase_seconds, phases)
        return results

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class TrainerWorker:
    def __init__(self, trainer: Trainer, sync: WeightSync, evaluate: Callable[[], dict[str, float]],
                 pool: ThreadPoolExecutor | None = None) -> None:
        self.trainer, self.sync, self._evaluate = trainer, sync, evaluate
        self.pool = pool or thread_for(trainer.device, "trainer")
        self.version = trainer.version  # published version: what admission and staleness count

    async def train(self, groups: list[Group]) -> dict[str, float]:
        metrics = await _on(self.pool, self._train, groups)
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
        return await _on(self.pool, self._evaluate_and_release)

    def _evaluate_and_release(self) -> dict[str, float]:
        metrics = self._evaluate()
        release_freed_memory(self.trainer.device)
        return metrics

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run other trainer-side work (checkpointing) on the trainer's thread."""
        return await _on(self.pool, fn, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
