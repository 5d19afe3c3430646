"""The overlapped engine (step t+1 launched before step t's tokens are read) against the plain one,
and the device's own liveness rule against the host's bookkeeping."""
import json

import pytest
import torch

from aioareal.config import load_config
from aioareal.generation import Engine, SamplingParams
from aioareal.generation.engine import resolve_overlap
from aioareal.models import random_model
from aioareal.run.recipe import train
from aioareal.samples import Group

EOS = [3, 5, 52]


def _model(device="cpu", dtype=torch.float32):
    """The random tiny model with its matrices scaled up: at the default init greedy decoding
    repeats one token forever; scaled, completions wander through the vocabulary and hit EOS ids
    at various lengths."""
    model = random_model("tiny", dtype, torch.device(device), seed=3)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6)
    return model


def _requests():
    """Mixed group sizes (18 sequences for 6 slots: slots are reused by waiting groups), two groups
    with forced lengths (EOS ignored; 40 is capped by max_new_tokens)."""
    gen = torch.Generator().manual_seed(0)
    sizes, forced = [1, 3, 2, 4, 1, 2, 3, 2], {2: [1, 7], 5: [40, 3]}
    out = []
    for gid, n in enumerate(sizes):
        length = int(torch.randint(2, 14, (1,), generator=gen))
        out.append(Group(gid, torch.randint(4, 100, (length,), generator=gen).tolist(), size=n,
                         forced_lengths=forced.get(gid)))
    return out


def _engine(overlap, model=None, slots=6, greedy=True, **kw):
    params = SamplingParams(greedy=greedy, max_new_tokens=16)
    return Engine(model or _model(), eos_ids=EOS, num_slots=slots, max_len=48, params=params, seed=1,
                  overlap=overlap, **kw)


def _run(engine, requests, each_step=None):
    """Generate to the end; returns {group_id: completions} and the groups in the order returned."""
    for r in requests:
        engine.submit(r)
    results, steps = [], 0
    while engine.busy:
        results += engine.step()
        steps += 1
        if each_step is not None:
            each_step(engine, steps)
    order = [r.group_id for r in results]
    assert sorted(order) == sorted(r.group_id for r in requests)  # every group, exactly once
    return {r.group_id: r.completions for r in results}, order


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for gid in a:
        for x, y in zip(a[gid], b[gid], strict=True):
            assert (x.tokens, x.versions, x.finish_reason) == (y.tokens, y.versions, y.finish_reason), gid
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=1e-5)


def test_greedy_completions_identical_with_and_without_overlap():
    plain, _ = _run(_engine(False), _requests())
    overlapped, _ = _run(_engine(True), _requests())
    _assert_same(plain, overlapped)
    reasons = [c.finish_reason for cs in plain.values() for c in cs]
    assert "stop" in reasons and "length" in reasons  # the scenario exercises both ends
    assert [len(c.tokens) for c in plain[2]] == [1, 7] and [len(c.tokens) for c in plain[5]] == [16, 3]


def test_cpu_live_slot_decode_and_full_decode_agree_under_overlap(monkeypatch):
    """Overlap with the CPU's live-slot decode (which decodes slots that finished in the step in
    flight once more) and with every slot decoded: the same completions."""
    live, _ = _run(_engine(True), _requests())
    engine = _engine(True)
    monkeypatch.setattr(engine, "_decode_live", lambda n, span: engine._decode_into(n, span))
    every, _ = _run(engine, _requests())
    _assert_same(live, every)


def test_overlap_admits_into_freed_slots_one_step_later():
    """A slot freed at step t takes a waiting group at step t+2 with overlap (t+1 without): one
    extra step per group, the one launched while the host reads the group's last tokens."""
    steps = {}
    for overlap in (False, True):
        engine = _engine(overlap, slots=3)
        count = []
        _run(engine, [Group(i, [7, 8, 9], size=3, forced_lengths=[4, 4, 4]) for i in range(3)],
             lambda e, s: count.append(s))
        steps[overlap] = count[-1]
    # Plain: per group, a step of prefill + decode (2 tokens), then 2 decode steps: 9 steps.
    assert steps[False] == 9 and steps[True] == 9 + 3


def test_device_liveness_equals_host_running_set():
    """The device clears `live` by the host's rule (liveness.py): after every plain step (all read)
    the live slots are exactly the running ones; with overlap, the host's running set is a
    superset (it may hold slots that finished in the step in flight)."""
    def check(exact):
        def each(engine, _):
            live = set(torch.nonzero(engine.live).flatten().tolist())
            running = set(engine.running)
            assert live == running if exact else live <= running
        return each

    _run(_engine(False), _requests(), check(True))
    _run(_engine(True), _requests(), check(False))


def adopt_at_5(engine, step):
    """`_run`'s per-step hook: new weights (really different ones) adopted after step 5."""
    if step == 5:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(9)
            for p in engine.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        engine.adopt(engine.version + 1)


@pytest.mark.parametrize("recompute", [True, False])
def test_mid_rollout_adopt_records_the_same_versions(recompute):
    """New weights adopted after step 5: per-token versions, tokens and logprobs are the plain
    engine's. Every group fits at once, so both engines admit at the same steps and the adoption
    falls between the same two device steps of every sequence."""
    requests = _requests()[:4]  # 10 sequences, 10 slots
    plain, _ = _run(_engine(False, slots=10, recompute_kv=recompute), requests, adopt_at_5)
    overlapped, _ = _run(_engine(True, slots=10, recompute_kv=recompute), _requests()[:4], adopt_at_5)
    _assert_same(plain, overlapped)
    versions = [c.versions for cs in plain.values() for c in cs]
    assert any(v[0] == 0 and v[-1] == 1 for v in versions)  # some sequences span both versions


def test_sampled_overlap_finishes_every_group_with_full_forward_logprobs():
    model = _model()
    engine = _engine(True, model=model, greedy=False)
    done, _ = _run(engine, _requests())
    for gid, completions in done.items():
        request = _requests()[gid]
        for i, c in enumerate(completions):
            limit = 16 if request.forced_lengths is None else min(16, request.forced_lengths[i])
            assert 1 <= len(c.tokens) <= limit and len(c.logprobs) == len(c.tokens) == len(c.versions)
            ended_on_eos = request.forced_lengths is None and c.tokens[-1] in EOS
            assert c.finish_reason == ("stop" if ended_on_eos else "length")
            assert ended_on_eos or len(c.tokens) == limit
            assert request.forced_lengths is not None or not set(c.tokens[:-1]) & set(EOS)
            ids = torch.tensor([request.prompt_ids + c.tokens])
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0].float(), -1)
            ref = logp[len(request.prompt_ids) - 1:-1].gather(-1, torch.tensor(c.tokens)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=1e-4)
    assert engine.pending is None and not engine.busy and len(engine.free) == 6


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
        engine = _engine(overlap, model=_model("cuda"), cuda_graphs=graphs, timed=True)
        out = _run(engine, _requests())[0]
        assert engine.overlap is overlap and (engine.graphs is not None) is graphs
        engine.timer.take()
        return out

    _assert_same(run(False), run(True))


@pytest.mark.gpu
def test_cuda_overlap_sampled_runs_finish():
    engine = _engine("auto", model=_model("cuda"), greedy=False, cuda_graphs=True)
    assert engine.overlap
    done, _ = _run(engine, _requests())
    assert all(0 <= t < 128 for cs in done.values() for c in cs for t in c.tokens)


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
    assert all(r["time_gen_sync"] >= 0 and r["time_gen_bookkeep"] >= 0 for r in rows[1:])
