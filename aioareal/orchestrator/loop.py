"""The event loop's two coroutines: the generator keeps admitted prompts flowing through the engine,
the trainer turns oldest-first batches into policy versions; they meet in the admission counters and
the oldest-first buffer. Modes (docs/training.md#modes): sync (K = 0, a batch generated then trained),
one-step (K = 1, batch i+1 generated while batch i trains), async (any K, slots refilled group by
group, a new version adopted between any two decode steps).

The admission and batching rules (docs/architecture.md rules 1 and 2) are plain bookkeeping with no
I/O: a new group starts only while accepted + running < (K + v + 1) * B (AReaL, arXiv 2505.24298,
eq. 3), and batches are the B oldest groups *by admission order*, which together bound every trained
sample's staleness by K (the oldest *finished* groups would not).
"""
from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from ..checkpoint import RunState
from ..errors import UserError
from ..group import Example, Group
from ..monitor.metrics import Clocks, StepReport, sample_rows, step_row
from .workers import GenerationWorker, TrainingWorker

# drop_constant_groups gives up after this many batches' worth of rejected groups in a row: far
# beyond what a model that solves 90% of its prompts produces by chance (0.9**200 < 1e-9 at B=2).
REJECT_LIMIT = 100

# A finished group -> (one reward per sample, failed verifications): the reward service's `score_group`.
GroupScorer = Callable[[Group], Awaitable[tuple[list[float], int]]]


# -- admission and the oldest-first buffer (rules 1 and 2) -------------------------------------------
@dataclass
class Admission:
    batch_groups: int  # B
    max_staleness: int  # K
    accepted: int = 0  # groups finished and kept, cumulative (minus groups dropped as stale)
    running: int = 0  # admitted, not yet finished

    def capacity(self, version: int) -> int:
        """How many more groups may start at `version`."""
        return (self.max_staleness + version + 1) * self.batch_groups - self.accepted - self.running

    def admit(self) -> None:
        self.running += 1

    def finish(self, kept: bool) -> None:
        self.running -= 1
        self.accepted += kept

    def drop_accepted(self, n: int = 1) -> None:
        """Groups dropped by the replay filter free their place."""
        self.accepted -= n

    def restore(self, version: int) -> None:
        """On resume: every accepted group up to `version` was trained; nothing is running."""
        self.accepted, self.running = version * self.batch_groups, 0


@dataclass
class Ledger:
    """Group counts that must add up: admitted = trained + dropped_stale + rejected + in_flight."""

    admitted: int = 0
    trained: int = 0
    dropped_stale: int = 0
    rejected: int = 0

    @property
    def in_flight(self) -> int:
        return self.admitted - self.trained - self.dropped_stale - self.rejected


class OldestFirstBuffer:
    """Finished groups, handed to the trainer strictly in admission order."""

    def __init__(self) -> None:
        self.order: deque[int] = deque()
        self.done: dict[int, Group] = {}
        self._changed = asyncio.Event()

    def admitted(self, group_id: int) -> None:
        self.order.append(group_id)

    def finished(self, group: Group) -> None:
        self.done[group.group_id] = group
        self._changed.set()

    def rejected(self, group_id: int) -> None:
        self.order.remove(group_id)
        self._changed.set()

    def ready(self) -> int:
        """Groups at the head of the line that are finished (what the next batch could take now)."""
        n = 0
        for gid in self.order:
            if gid not in self.done:
                break
            n += 1
        return n

    async def take(self, n: int) -> list[Group]:
        while self.ready() < n:
            self._changed.clear()
            await self._changed.wait()
        return [self.done.pop(self.order.popleft()) for _ in range(n)]


# -- the prompt source ---------------------------------------------------------------------------------
# Training prompts in a seeded shuffled order, epoch after epoch, with a cursor for resume. With
# data.order=easy-first the first epoch runs from the shortest reference answer to the longest (a
# curriculum: GSM8K's answer length counts the steps). Under torchrun rank r takes positions
# r, r + N, r + 2N, ... of the same shuffled stream.
class PromptSource:
    def __init__(self, examples: list[Example], encode: Callable[[Example], list[int]], seed: int,
                 cursor: int = 0, stride: int = 1, offset: int = 0, easy_first: bool = False) -> None:
        """`cursor` counts this source's own draws; `stride`, `offset`: world size and rank."""
        if not examples:
            raise ValueError("no training examples")
        self.examples, self.encode, self.seed, self.cursor = examples, encode, seed, cursor
        self.stride, self.offset, self.easy_first = stride, offset, easy_first
        self._epoch, self._order = -1, list(range(len(examples)))

    def _order_of(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.examples)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
            if epoch == 0 and self.easy_first:  # a stable sort: equal lengths keep the shuffled order
                self._order.sort(key=lambda i: len(self.examples[i].answer))
            self._epoch = epoch
        return self._order

    def next(self) -> tuple[Example, list[int]]:
        epoch, index = divmod(self.cursor * self.stride + self.offset, len(self.examples))
        self.cursor += 1
        example = self.examples[self._order_of(epoch)[index]]
        return example, self.encode(example)


# -- the loop ---------------------------------------------------------------------------------------
@dataclass
class Schedule:
    mode: str
    max_staleness: int
    batch_groups: int
    group_size: int
    steps: int
    eval_every: int = 0
    drop_constant_groups: bool = False  # reject groups whose rewards are all equal (zero advantage)
    sample_text_chars: int = 0  # characters of each completion's text in the sample rows (run.sample_text_chars)


class Hooks(Protocol):
    """What the run does with each step's report (write rows, show, checkpoint) and at a stop.
    `on_step` may return a signal number: stop after this step as if that signal had arrived (under
    torchrun, a stop that another rank was asked for)."""

    async def on_step(self, report: StepReport) -> int | None: ...
    async def on_stop(self, state: RunState) -> None: ...


class Orchestrator:
    def __init__(self, schedule: Schedule, gen: GenerationWorker, train: TrainingWorker, prompts: PromptSource,
                 score: GroupScorer, hooks: Hooks, resume: RunState | None = None,
                 score_counters: Callable[[], dict[str, int]] = dict) -> None:
        """`resume`: the checkpoint's counters; `score_counters`: the scorer's running counts per row."""
        self.schedule, self.gen, self.train = schedule, gen, train
        self.prompts, self.score, self.hooks = prompts, score, hooks
        self.score_counters = score_counters
        self.start_version = resume.step if resume else 0
        self.admission = Admission(schedule.batch_groups, schedule.max_staleness)
        self.admission.restore(self.start_version)  # docs/architecture.md rule 1: counters follow from the version
        self.buffer = OldestFirstBuffer()
        self.ledger = Ledger()
        self.reward_failures = 0
        self.elapsed_before = 0.0
        if resume:
            # Groups in flight at the checkpoint are regenerated from the saved cursor, not lost.
            self.ledger = Ledger(**{**resume.ledger, "admitted": 0})
            self.ledger.admitted = self.ledger.trained + self.ledger.dropped_stale + self.ledger.rejected
            self.reward_failures, self.elapsed_before = resume.reward_failures, resume.elapsed
        self.untrained: dict[int, int] = {}  # group id -> prompt cursor, for admitted groups not yet trained
        self.next_group_id = 0
        self.busy = {"gen": 0.0, "train": 0.0}
        self.score_seconds = 0.0  # time groups spent being scored (overlapping groups add up)
        self.stop_requested = False
        self.rejected_in_a_row = 0  # by drop_constant_groups, to stop a run that can never fill a batch
        self.stop_signal: int | None = None
        self._trainer_waiting = False  # the trainer is blocked on a batch (see `_admit`)
        self._finishing: set[asyncio.Task] = set()
        self._failure: asyncio.Future[None] | None = None  # the first exception of a `_finish` task
        self._wake: asyncio.Event | None = None
        self.t0 = 0.0

    # -- time ------------------------------------------------------------------------------------
    def now(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    async def _timed(self, worker: str, awaitable: Awaitable[Any]) -> Any:
        start = self.now()
        try:
            return await awaitable
        finally:
            self.busy[worker] += self.now() - start

    def clocks(self) -> Clocks:
        phases = {**self.gen.phase_seconds, "score": self.score_seconds}
        return Clocks(self.now(), self.busy["gen"], self.busy["train"], self.gen.tokens_generated, phases)

    # -- state -----------------------------------------------------------------------------------
    def state(self, step: int) -> RunState:
        """The counters a checkpoint after `step` holds. The prompt cursor a resumed run restarts
        from is the oldest admitted group's not yet trained: groups in flight are regenerated."""
        cursor = min(self.untrained.values(), default=self.prompts.cursor)
        return RunState(step=step, cursor=cursor, elapsed=self.now(), ledger=asdict(self.ledger),
                        reward_failures=self.reward_failures)

    def live_counters(self) -> dict[str, int]:
        """What the dashboard shows between steps (read on the event loop's thread)."""
        return {"trainer_version": self.train.version, "generator_version": self.gen.version,
                "groups_running": self.admission.running, "groups_ready": self.buffer.ready()}

    # -- entry point -----------------------------------------------------------------------------
    async def run(self) -> None:
        self.t0 = asyncio.get_running_loop().time() - self.elapsed_before
        self._wake = asyncio.Event()
        self.gen.on_work(self._wake.set)  # episodes' turns and finished groups arrive by themselves
        self._failure = asyncio.get_running_loop().create_future()
        if self.start_version == 0:  # step 0: the policy before any update
            metrics = await self._timed("train", self.train.evaluate())
            row = {"step": 0, "version": 0, "time": self.now(), **metrics}
            await self._report(StepReport(0, row, [], [], self.state(0)))
        tasks = [asyncio.create_task(self._generate(), name="generator"),
                 asyncio.create_task(self._train(), name="trainer")]
        try:
            # The run ends when the trainer does; the generator or scoring only end it by failing.
            done, _ = await asyncio.wait([*tasks, self._failure], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise a failure of either side
            if not tasks[1].done():
                raise RuntimeError("the generator stopped before the trainer finished")
        finally:
            self.stop_requested = True
            self._wake.set()
            if self._failure.done() and not self._failure.cancelled():
                self._failure.exception()  # retrieved (maybe re-raised above): no "never retrieved" warning
            for task in [*tasks, *self._finishing, self._failure]:
                task.cancel()
            await asyncio.gather(*tasks, *self._finishing, return_exceptions=True)

    async def _report(self, report: StepReport) -> None:
        signum = await self.hooks.on_step(report)
        if signum is not None:
            self.request_stop(signum)

    def request_stop(self, signum: int = 2) -> None:
        """Finish the current training step, then stop (`signum`: the signal that asked, SIGINT=2)."""
        self.stop_requested = True
        self.stop_signal = signum

    # -- generator side --------------------------------------------------------------------------
    def _still_needed(self) -> int:
        """Groups the remaining steps will consume beyond those already admitted and kept."""
        kept = self.ledger.admitted - self.ledger.rejected - self.ledger.dropped_stale
        return self.schedule.steps * self.schedule.batch_groups - kept  # the ledger counts from the run's first step

    def _admit(self) -> None:
        if self.stop_requested and not self._trainer_waiting:
            # New groups would only delay the exit (and draw from the sampling RNG after the checkpoint).
            return
        version, schedule = self.train.version, self.schedule
        room = min(self.admission.capacity(version), self._still_needed())
        if schedule.mode == "async":
            while room > 0 and self.gen.free_slots() >= schedule.group_size:
                self._submit(version)
                room -= 1
        elif not self.gen.busy and room > 0:
            # Whole batches; after drop_constant_groups rejected some, only the replacements (room < B).
            for _ in range(min(room, schedule.batch_groups)):
                self._submit(version)

    def _submit(self, version: int) -> None:
        cursor = self.prompts.cursor
        example, prompt_ids = self.prompts.next()
        group = Group(self.next_group_id, prompt_ids, self.schedule.group_size, example, version, self.now(), cursor)
        self.untrained[group.group_id] = cursor
        self.next_group_id += 1
        self.admission.admit()
        self.ledger.admitted += 1
        self.buffer.admitted(group.group_id)
        self.gen.submit(group)

    async def _generate(self) -> None:
        # Runs until cancelled: a requested stop still needs the batch of the step in progress.
        while True:
            self._admit()
            if not self.gen.busy:
                self._wake.clear()
                await self._wake.wait()
                continue
            # sync/one-step adopt new weights only between batches; async between any two steps.
            adopt = self.schedule.mode == "async" or self.gen.in_flight == 0
            results = await self._timed("gen", self.gen.step(adopt))
            for group in results:
                task = asyncio.create_task(self._finish(group))
                self._finishing.add(task)
                task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        """A group's scoring ended; if it failed, fail the run (the trainer would wait for it forever)."""
        self._finishing.discard(task)
        if not task.cancelled() and task.exception() is not None and not self._failure.done():
            self._failure.set_exception(task.exception())

    async def _finish(self, group: Group) -> None:
        group.finished_at = self.now()
        rewards, failures = await self.score(group)
        self.score_seconds += self.now() - group.finished_at
        group.set_rewards(rewards, failures)
        self.reward_failures += failures
        kept = not (self.schedule.drop_constant_groups and len(set(rewards)) == 1)
        self.rejected_in_a_row = 0 if kept else self.rejected_in_a_row + 1
        if self.rejected_in_a_row > REJECT_LIMIT * self.schedule.batch_groups:
            raise UserError(f"algo.drop_constant_groups rejected {self.rejected_in_a_row} groups in a row: every "
                            "group's rewards are equal (the policy solves all of its prompts or none); turn the "
                            "filter off, or start from a policy that solves some")
        self.admission.finish(kept)
        if kept:
            self.buffer.finished(group)
        else:
            self.ledger.rejected += 1
            self.untrained.pop(group.group_id, None)
            self.buffer.rejected(group.group_id)
        self._wake.set()

    # -- trainer side ----------------------------------------------------------------------------
    async def _next_batch(self) -> tuple[list[Group], int]:
        """B groups, oldest first; groups staler than K are dropped (docs/architecture.md rule 2) and replaced."""
        batch: list[Group] = []
        dropped = 0
        version = self.train.version
        while len(batch) < self.schedule.batch_groups:
            self._trainer_waiting = True
            try:
                taken = await self.buffer.take(self.schedule.batch_groups - len(batch))
            finally:
                self._trainer_waiting = False
            for group in taken:
                if group.staleness(version) > self.schedule.max_staleness:
                    dropped += 1
                    self.untrained.pop(group.group_id, None)
                    self.admission.drop_accepted()
                    self.ledger.dropped_stale += 1
                    self._wake.set()
                else:
                    batch.append(group)
        return batch, dropped

    async def _train(self) -> None:
        before = self.clocks()
        while self.train.version < self.schedule.steps and not self.stop_requested:
            groups, dropped = await self._next_batch()
            trained_version = self.train.version
            started = self.now()
            metrics = await self._timed("train", self.train.train(groups))
            train_seconds = self.now() - started
            if self.schedule.mode != "sync":
                self._wake.set()  # sync waits for this step's checkpoint, so a resume replays exactly
            self.ledger.trained += len(groups)
            for group in groups:
                self.untrained.pop(group.group_id, None)
            step = self.train.version
            if self.schedule.eval_every and step % self.schedule.eval_every == 0 or step == self.schedule.steps:
                metrics.update(await self._timed("train", self.train.evaluate()))
            now = self.clocks()
            row = step_row(step, trained_version, groups, metrics, train_seconds, before, now,
                           self._counters(dropped))
            before = now
            samples = sample_rows(step, trained_version, groups, now.time, self.schedule.sample_text_chars)
            await self._report(StepReport(step, row, samples, groups, self.state(step)))
            self._wake.set()
        if self.stop_requested and self.train.version < self.schedule.steps:
            await self.hooks.on_stop(self.state(self.train.version))

    def _counters(self, dropped: int) -> dict[str, Any]:
        return {"version": self.train.version, "gen_version": self.gen.version, "dropped_stale": dropped,
                "groups_admitted": self.ledger.admitted, "groups_trained": self.ledger.trained,
                "groups_dropped_stale": self.ledger.dropped_stale, "groups_rejected": self.ledger.rejected,
                "groups_in_flight": self.ledger.in_flight, "groups_ready": self.buffer.ready(),
                "reward_failures": self.reward_failures, **self.score_counters()}
