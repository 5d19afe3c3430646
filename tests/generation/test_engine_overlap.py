"""The overlapped engine (step t+1 launched before step t's tokens are read) against the plain one,
and the device's own liveness rule against the host's bookkeeping."""
import json

import pytest
import torch
from engine_helpers import (
    WANDER_EOS,
    assert_same_completions,
    mixed_groups,
    new_weights_after,
    reference_logprobs,
    run_to_end,
    wandering_engine,
    wandering_model,
)

from aioareal.config import load_config
from aioareal.generation.engine import resolve_overlap
from aioareal.group import Group
from aioareal.run.recipe import train


def test_greedy_completions_identical_with_and_without_overlap():
    plain, _ = run_to_end(wandering_engine(False), mixed_groups())
    overlapped, _ = run_to_end(wandering_engine(True), mixed_groups())
    assert_same_completions(plain, overlapped)
    reasons = [c.finish_reason for cs in plain.values() for c in cs]
    assert "stop" in reasons and "length" in reasons  # the scenario exercises both ends
    assert [len(c.tokens) for c in plain[2]] == [1, 7] and [len(c.tokens) for c in plain[5]] == [16, 3]


def test_cpu_live_slot_decode_and_full_decode_agree_under_overlap(monkeypatch):
    """Overlap with the CPU's live-slot decode (which decodes slots that finished in the step in
    flight once more) and with every slot decoded: the same completions."""
    live, _ = run_to_end(wandering_engine(True), mixed_groups())
    engine = wandering_engine(True)
    monkeypatch.setattr(engine, "_decode_live", lambda n, span: engine._decode_into(n, span))
    every, _ = run_to_end(engine, mixed_groups())
    assert_same_completions(live, every)


def test_overlap_admits_into_freed_slots_one_step_later():
    """A slot freed at step t takes a waiting group at step t+2 with overlap (t+1 without): one
    extra step per group, the one launched while the host reads the group's last tokens."""
    def steps_to_finish(overlap: bool) -> int:
        count = []
        groups = [Group(i, [7, 8, 9], size=3, forced_lengths=[4, 4, 4]) for i in range(3)]
        run_to_end(wandering_engine(overlap, slots=3), groups, lambda e, s: count.append(s))
        return count[-1]

    steps = {overlap: steps_to_finish(overlap) for overlap in (False, True)}
    # Plain: per group, a step of prefill + decode (2 tokens), then 2 decode steps: 9 steps.
    assert steps[False] == 9 and steps[True] == 9 + 3


def test_device_liveness_equals_host_running_set():
    """The device clears `live` by the host's rule (generation/scheduler.py `SlotLimits`): after every
    plain step (all read) the live slots are exactly the running ones; with overlap, the host's running set is a
    superset (it may hold slots that finished in the step in flight)."""
    def check(exact):
        def each(engine, _):
            live = set(torch.nonzero(engine.live).flatten().tolist())
            running = set(engine.running)
            if exact:
                assert live == running
            else:
                assert live <= running
                behind.append(live < running)
        return each

    behind = []
    run_to_end(wandering_engine(False), mixed_groups(), check(True))
    run_to_end(wandering_engine(True), mixed_groups(), check(False))
    assert any(behind)  # the host did hold slots the device had finished: the superset is a real one


@pytest.mark.parametrize("recompute", [True, False])
def test_mid_rollout_adopt_records_the_same_versions(recompute):
    """New weights adopted after step 5: per-token versions, tokens and logprobs are the plain
    engine's. Every group fits at once, so both engines admit at the same steps and the adoption
    falls between the same two device steps of every sequence."""
    runs = {overlap: run_to_end(wandering_engine(overlap, slots=10, recompute_kv=recompute),
                                mixed_groups()[:4], new_weights_after(5))[0]  # 10 sequences, 10 slots
            for overlap in (False, True)}
    plain, overlapped = runs[False], runs[True]
    assert_same_completions(plain, overlapped)
    versions = [c.versions for cs in plain.values() for c in cs]
    assert any(v[0] == 0 and v[-1] == 1 for v in versions)  # some sequences span both versions


def _assert_finished(engine, done):
    """Every sequence of mixed_groups() ended as it should: on its first WANDER_EOS id (forced
    lengths aside) or at its length limit, with one log-prob and one version per token; the engine
    holds nothing."""
    requests = mixed_groups()
    for gid, completions in done.items():
        request = requests[gid]
        for i, c in enumerate(completions):
            limit = 16 if request.forced_lengths is None else min(16, request.forced_lengths[i])
            assert 1 <= len(c.tokens) <= limit and len(c.logprobs) == len(c.tokens) == len(c.versions)
            ended_on_eos = request.forced_lengths is None and c.tokens[-1] in WANDER_EOS
            assert c.finish_reason == ("stop" if ended_on_eos else "length")
            assert ended_on_eos or len(c.tokens) == limit
            assert request.forced_lengths is not None or not set(c.tokens[:-1]) & set(WANDER_EOS)
    assert engine.pending is None and not engine.busy and len(engine.free) == engine.num_slots


def test_sampled_overlap_finishes_every_group_with_full_forward_logprobs():
    model = wandering_model()
    engine = wandering_engine(True, model=model, greedy=False)
    done, _ = run_to_end(engine, mixed_groups())
    _assert_finished(engine, done)
    requests = mixed_groups()
    for gid, completions in done.items():
        for c in completions:
            ref = reference_logprobs(model, requests[gid].prompt_ids, c.tokens)
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=1e-4)


def test_overlap_setting_resolves_auto_by_device():
    assert resolve_overlap("auto", torch.device("cpu")) is False
    assert resolve_overlap("auto", torch.device("cuda", 0)) is True
    assert resolve_overlap(True, torch.device("cpu")) is True
    with pytest.raises(ValueError, match="overlap must be"):
        resolve_overlap("yes", torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_overlap_matches_plain_greedy(graphs):
    """On CUDA: pinned non-blocking copies, events, and (with graphs) the liveness update captured
    inside the decode graph."""
    def run(overlap):
        engine = wandering_engine(overlap, model=wandering_model("cuda"), cuda_graphs=graphs, timed=True)
        out = run_to_end(engine, mixed_groups())[0]
        assert engine.overlap is overlap and (engine.graphs is not None) is graphs
        engine.timer.take()
        return out

    assert_same_completions(run(False), run(True))


@pytest.mark.gpu
def test_cuda_overlap_sampled_runs_finish():
    engine = wandering_engine("auto", model=wandering_model("cuda"), greedy=False, cuda_graphs=True)
    assert engine.overlap
    done, _ = run_to_end(engine, mixed_groups())
    _assert_finished(engine, done)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_training_run_with_overlap_on_the_cpu(tmp_path, mode):
    """The whole loop with an overlapped engine: adoption mid-rollout (async) or between batches
    (sync: the orchestrator adopts when nothing is in flight), results read a step late."""
    run_dir = tmp_path / "run"
    config = load_config(overrides=["model.name=random:tiny", "train.steps=3", "algo.batch_groups=2",
                                    "eval.every=0", "data.eval_size=8", "generation.overlap=true"],
                         flags={"run.run_dir": str(run_dir), "rollout.mode": mode})
    train(config, log=lambda *_: None, printer=lambda row: None)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows[1:]] == [1, 2, 3]
    # Sync adopts only between batches: nothing stale, no sample spans two versions. Async keeps
    # to its bound with results read a step late.
    assert max(r["staleness_max"] for r in rows[1:]) <= (0 if mode == "sync" else config.rollout.max_staleness)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 2 * config.algo.group_size  # every trained sample of the three steps
    assert mode == "async" or all(s["version_min"] == s["version_max"] for s in samples)
