"""The orchestrator's scheduling under a virtual clock: simulated generator and trainer with
modelled latencies and long-tailed lengths, the real admission, buffer and coroutine code."""
from __future__ import annotations

import asyncio
import random
from statistics import fmean

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simulated_workers import SimulatedGenerator, SimulatedTrainer

from aioareal.checkpoint import RunState
from aioareal.group import Completion, Example, Group, Sample
from aioareal.lab.simulate.lengths import gsm8k_like_length
from aioareal.lab.simulate.virtualclock import run_virtual
from aioareal.orchestrator import Orchestrator, Schedule
from aioareal.orchestrator.loop import Admission, OldestFirstBuffer, PromptSource


class Recorder:
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.samples: list[dict] = []
        self.o: Orchestrator | None = None
        self.untrained: list[int] = []  # groups started and not yet trained, each time one starts

    async def on_step(self, report):
        self.rows.append(report.row)
        self.samples += report.samples

    async def on_stop(self, state):
        pass


def simulate(mode="async", k=2, b=4, g=4, steps=20, slots=None, train_time=1.0, step_base=0.02,
             mean_len=100.0, seed=0, reject_constant=False):
    trainer = SimulatedTrainer(base=train_time)
    length = lambda rng: gsm8k_like_length(rng, mean=mean_len, cap=int(mean_len * 6))  # noqa: E731
    gen = SimulatedGenerator(slots or b * g, trainer, length, step_base=step_base, seed=seed)
    prompts = PromptSource([Example(str(i), f"q{i}", "a") for i in range(50)], lambda e: [1, 2], seed=seed)
    reward_rng = random.Random(seed)

    async def score(group):
        await asyncio.sleep(0.005)
        return [float(reward_rng.random() < 0.5) for _ in group.samples], 0

    rec = Recorder()
    o = Orchestrator(Schedule(mode, k, b, g, steps, drop_constant_groups=reject_constant),
                     gen, trainer, prompts, score, rec)
    rec.o = o
    submit = gen.submit

    def submit_and_count(request):
        submit(request)
        rec.untrained.append(request.group_id + 1 - len(trainer.trained_group_ids) - o.ledger.rejected
                             - o.ledger.dropped_stale)

    gen.submit = submit_and_count
    run_virtual(o.run())
    return o, trainer, gen, rec


@pytest.mark.parametrize("mode, k", [("sync", 0), ("one-step", 1), ("async", 0), ("async", 1), ("async", 3)])
def test_staleness_bound_is_exact_and_nothing_is_lost(mode, k):
    o, trainer, gen, rec = simulate(mode, k, steps=25)
    staleness = [s["staleness"] for s in rec.samples]
    assert max(staleness) <= k
    assert o.ledger.dropped_stale == 0  # rule 1 + oldest-first batches: the filter never fires
    # Every admitted group is trained exactly once, in admission order.
    assert trainer.trained_group_ids == list(range(25 * 4))
    assert o.ledger.admitted == len(rec.untrained) == 25 * 4  # the generator started just the groups trained
    assert o.ledger.in_flight == 0
    # Admission's consequence, observed as groups start: at most K + 1 batches' worth of groups are
    # admitted and untrained at any moment, and the generator does use all of that allowance.
    assert max(rec.untrained) == (k + 1) * 4
    if k > 0 and mode != "sync":
        assert max(staleness) == k  # the generator really runs ahead


def test_async_keeps_the_generator_busier_and_finishes_sooner():
    _, _, _, sync = simulate("sync", 0, steps=20)
    _, _, _, fast = simulate("async", 2, steps=20)
    idle = lambda rec: fmean(r["gen_idle_frac"] for r in rec.rows[1:])  # noqa: E731
    assert idle(fast) < idle(sync)
    assert fast.rows[-1]["time"] < sync.rows[-1]["time"]


def test_async_with_k0_behaves_like_sync():
    _, t_sync, _, r_sync = simulate("sync", 0, steps=10)
    _, t_async, _, r_async = simulate("async", 0, steps=10)
    assert t_sync.trained_group_ids == t_async.trained_group_ids
    assert all(s["staleness"] == 0 for s in r_async.samples)
    assert [r["time"] for r in r_sync.rows] == pytest.approx([r["time"] for r in r_async.rows])


def test_long_generations_are_interrupted_by_new_versions():
    # Generation slower than training: versions land mid-rollout.
    o, _, gen, rec = simulate("async", 2, steps=15, train_time=0.5, mean_len=200)
    interrupted = [s for s in rec.samples if s["version_min"] < s["version_max"]]
    assert interrupted and gen.adoptions > 0
    assert max(s["staleness"] for s in rec.samples) <= 2


def test_sync_and_one_step_adopt_weights_only_between_batches():
    for mode, k in (("sync", 0), ("one-step", 1)):
        _, _, _, rec = simulate(mode, k, steps=12, train_time=0.5, mean_len=200)
        assert all(s["version_min"] == s["version_max"] for s in rec.samples)


@pytest.mark.parametrize("mode, k", [("sync", 0), ("one-step", 1), ("async", 1)])
def test_rejected_groups_free_their_place_and_are_counted(mode, k):
    """Sync and one-step too: once a batch mixes kept and rejected groups, the generator must make
    just the replacements, or the batch never fills and the trainer waits forever."""
    o, trainer, _, rec = simulate(mode, k, b=4, g=2, steps=10, reject_constant=True)
    assert o.ledger.rejected > 0
    assert len(trainer.trained_group_ids) == 40
    assert o.ledger.admitted == len(rec.untrained) and o.ledger.rejected == len(rec.untrained) - 40  # none left over
    assert max(s["staleness"] for s in rec.samples) <= k


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(0, 4), b=st.integers(1, 5), g=st.integers(1, 4), slot_factor=st.sampled_from([0.5, 1, 2]),
       train_time=st.floats(0.05, 3.0), step_base=st.floats(0.001, 0.05), mean_len=st.floats(5, 300),
       seed=st.integers(0, 1000))
def test_property_staleness_bound_and_exactly_once(k, b, g, slot_factor, train_time, step_base, mean_len, seed):
    slots = max(g, int(b * g * slot_factor))
    o, trainer, _, rec = simulate("async", k, b, g, steps=6, slots=slots, train_time=train_time,
                                  step_base=step_base, mean_len=mean_len, seed=seed)
    assert all(s["staleness"] <= k for s in rec.samples)
    assert trainer.trained_group_ids == sorted(set(trainer.trained_group_ids))
    assert len(trainer.trained_group_ids) == 6 * b
    assert o.ledger.admitted == len(rec.untrained) == 6 * b and o.ledger.dropped_stale == 0


@settings(max_examples=200, deadline=None, derandomize=True)
@given(k=st.integers(0, 5), b=st.integers(1, 8), events=st.lists(st.sampled_from("afrt"), max_size=200))
def test_property_admission_never_exceeds_its_bound(k, b, events):
    """The admission counters against a model that tracks each group: a = admit if there is capacity,
    f / r = the newest running group finishes kept / rejected, t = the trainer takes the B oldest
    admitted groups if all are finished (the oldest-first buffer's rule)."""
    a, version = Admission(b, k), 0
    queue: list[list] = []  # [admission version, finished] of every admitted, untrained, unrejected group
    for e in events:
        if e == "a" and a.capacity(version) > 0:
            a.admit()
            queue.append([version, False])
        elif e in "fr" and a.running > 0:
            a.finish(kept=e == "f")
            newest = max(i for i, (_, done) in enumerate(queue) if not done)
            if e == "f":
                queue[newest][1] = True
            else:
                del queue[newest]
        elif e == "t" and len(queue) >= b and all(done for _, done in queue[:b]):
            assert all(version - admitted <= k for admitted, _ in queue[:b])  # no trained group staler than K
            del queue[:b]
            version += 1
        # Never more than K + 1 batches' worth of groups admitted and untrained; while fewer, one may start.
        assert len(queue) <= (k + 1) * b and (a.capacity(version) > 0) == (len(queue) < (k + 1) * b)


def _group(gid: int, versions: list[int]) -> Group:
    group = Group(gid, [1], len(versions), Example(str(gid), "q", "a"), admitted_version=min(versions))
    group.samples = [Sample([1], Completion([5], [-1.0], [v], "stop"), 1.0) for v in versions]
    return group


def test_replay_filter_drops_and_counts_stale_groups_then_refills():
    async def go():
        trainer = SimulatedTrainer()
        trainer.version = 5
        o = Orchestrator(Schedule("async", 1, 2, 1, 10), gen=None, train=trainer, prompts=None, score=None,
                         hooks=None, resume=RunState(step=5, cursor=0, elapsed=0.0))
        o._wake = asyncio.Event()
        for gid, v in enumerate([2, 4, 5, 3, 5]):  # staleness at version 5: 3, 1, 0, 2, 0
            o.buffer.admitted(gid)
            o.buffer.finished(_group(gid, [v]))
        batch, dropped = await o._next_batch()
        return o, batch, dropped

    o, batch, dropped = asyncio.run(go())
    assert [g.group_id for g in batch] == [1, 2]
    assert dropped == 1 and o.ledger.dropped_stale == 1  # group 0; group 3 is still queued
    assert o.admission.accepted == 5 * 2 - 1  # the dropped group freed its place


def test_buffer_hands_out_groups_in_admission_order_only():
    async def go():
        buf = OldestFirstBuffer()
        for gid in range(3):
            buf.admitted(gid)
        buf.finished(_group(2, [0]))
        buf.finished(_group(1, [0]))
        assert buf.ready() == 0  # group 0 is still running: nothing can be taken
        waiter = asyncio.create_task(buf.take(2))
        await asyncio.sleep(0)
        assert not waiter.done()
        buf.finished(_group(0, [0]))
        return [g.group_id for g in await waiter]

    assert asyncio.run(go()) == [0, 1]


def test_a_failure_while_scoring_a_group_ends_the_run_instead_of_hanging_it():
    trainer = SimulatedTrainer(base=1.0)
    gen = SimulatedGenerator(16, trainer, lambda rng: 20, step_base=0.02, seed=0)
    prompts = PromptSource([Example(str(i), f"q{i}", "a") for i in range(50)], lambda e: [1, 2], seed=0)
    calls = []

    async def score(group):
        calls.append(group.group_id)
        if len(calls) == 3:
            raise ValueError("scorer bug")
        return [1.0] * group.size, 0

    o = Orchestrator(Schedule("async", 2, 4, 4, 10), gen, trainer, prompts, score, Recorder())
    with pytest.raises(ValueError, match="scorer bug"):  # not a timeout: the run did not wait forever
        run_virtual(asyncio.wait_for(o.run(), 10_000))


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=12), cut=st.integers(0, 30), seed=st.integers(0, 9))
def test_easy_first_runs_the_first_epoch_short_answers_first_and_resumes_exactly(lengths, cut, seed):
    """data.order=easy-first: epoch 0 holds every prompt once, from the shortest reference answer to the
    longest; later epochs are the shuffled ones; a source resumed at any cursor draws what the
    unbroken one drew."""
    examples = [Example(str(i), f"q{i}", "x" * n) for i, n in enumerate(lengths)]
    n = len(examples)

    def draws(cursor: int, count: int) -> list[str]:
        source = PromptSource(examples, lambda e: [], seed=seed, cursor=cursor, easy_first=True)
        return [source.next()[0].uid for _ in range(count)]
    stream = draws(0, 3 * n)
    first = stream[:n]
    assert sorted(first) == sorted(e.uid for e in examples)
    assert [lengths[int(u)] for u in first] == sorted(lengths)
    shuffled = PromptSource(examples, lambda e: [], seed=seed)
    assert stream[n:] == [shuffled.next()[0].uid for _ in range(3 * n)][n:]
    cut %= 3 * n
    assert draws(cut, 3 * n - cut) == stream[cut:]
