"""The engine serves episodes' turns (generation/scheduler.py): a sequence pauses at a stop string,
frees its slot, and resumes with the world's observation prefilled; its model tokens carry the
log-probs of a plain forward over the whole history and the version that sampled them."""
from __future__ import annotations

import pytest
import torch
from engine_helpers import WANDER_EOS, reference_logprobs, wandering_engine, wandering_model

from aioareal.generation import Engine, SamplingParams
from aioareal.generation.scheduler import StopStrings, TurnRequest
from aioareal.group import MODEL, OBS_LOGPROB, OBS_VERSION, Group, Turn

STOP_EVERY = 5  # the fake decode below writes "]" for every token id divisible by 5


def fake_decode(ids: list[int]) -> str:
    return "".join("]" if i % STOP_EVERY == 0 else "a" for i in ids)


STOP = StopStrings(("]",), fake_decode)


def run_turns(engine: Engine, turns: list[TurnRequest], each_step=None) -> list[tuple[TurnRequest, int]]:
    """Submit `turns`, step until idle; the (turn, index) of every ended sequence, in order."""
    for turn in turns:
        engine.submit_turn(turn)
    ended, steps = [], 0
    while engine.busy:
        assert engine.step() == []  # turns never come back as groups
        ended += engine.take_turns()
        steps += 1
        if each_step is not None:
            each_step(engine, steps)
    return ended


def observe(group: Group, index: int, tokens: list[int]) -> None:
    """What an episode does between turns: the world's tokens, with the record's placeholders."""
    c = group.samples[index].completion
    start = len(c.tokens)
    c.tokens += tokens
    c.logprobs += [OBS_LOGPROB] * len(tokens)
    c.versions += [OBS_VERSION] * len(tokens)
    c.turns.append(Turn("tool", "", start, len(c.tokens)))


def new_group(gid: int = 0, size: int = 3, prompt: list[int] | None = None) -> Group:
    group = Group(gid, prompt or [7, 8, 9, 11, 12], size)
    group.start_samples()
    return group


def test_a_turn_without_stop_strings_is_the_plain_group_path():
    plain = new_group()
    engine = wandering_engine(False, greedy=False)
    engine.submit(plain)
    while engine.busy:
        engine.step()
    turned = new_group()
    ended = run_turns(wandering_engine(False, greedy=False), [TurnRequest(turned, [0, 1, 2])])
    assert sorted(i for _, i in ended) == [0, 1, 2]
    for a, b in zip(plain.completions, turned.completions):
        assert (a.tokens, a.versions, a.finish_reason) == (b.tokens, b.versions, b.finish_reason)
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs))


@pytest.mark.parametrize("overlap", [False, True])
def test_turns_pause_at_stop_strings_and_resume_after_observations(overlap):
    model = wandering_model()
    engine = wandering_engine(overlap, model=model, greedy=False, slots=4)
    engine.params = SamplingParams(max_new_tokens=40)
    engine.sched.max_new_tokens = 40
    group = new_group()
    ended = run_turns(engine, [TurnRequest(group, [0, 1, 2], STOP)])
    assert sorted(i for _, i in ended) == [0, 1, 2]
    for round_ in range(3):
        requests = []
        for i, c in enumerate(group.completions):
            if c.finish_reason == "stop_string" and len(c.tokens) < 30:
                observe(group, i, [40 + round_, 41, 42])
                requests.append(TurnRequest(group, [i], STOP, max_tokens=6))
        if not requests:
            break
        run_turns(engine, requests)
    turned = 0
    for c in group.completions:
        model_turns = _model_spans(c)
        turned += len(model_turns) > 1
        for start, end in model_turns:  # each turn ends at its first stop token, EOS, or its length
            turn = c.tokens[start:end]
            assert all(t % STOP_EVERY and t not in WANDER_EOS for t in turn[:-1])
        ref = reference_logprobs(model, group.prompt_ids, c.tokens)
        mask = c.model_mask() or [True] * len(c.tokens)
        got = torch.tensor([lp for lp, m in zip(c.logprobs, mask) if m])
        torch.testing.assert_close(got, ref[torch.tensor(mask)], atol=1e-4, rtol=1e-4)
    assert turned >= 1  # the scenario did resume some sequences
    assert not engine.running and len(engine.free) == 4


def _model_spans(c) -> list[tuple[int, int]]:
    """The model's turns as token spans: the gaps between observations."""
    spans, start = [], 0
    for t in c.turns:
        if t.role != MODEL:
            spans.append((start, t.start))
            start = t.end
    return spans + [(start, len(c.tokens))]


def test_a_weight_update_between_turns_is_an_interruption_like_any_other():
    """The next turn is prefilled under the new weights (the recompute rule), and its tokens carry
    the new version; the sample's staleness counts from its oldest model token."""
    model = wandering_model()
    engine = wandering_engine(False, model=model, greedy=True, slots=2)
    group = new_group(size=1, prompt=[20, 21, 22])
    run_turns(engine, [TurnRequest(group, [0], STOP, max_tokens=3)])
    observe(group, 0, [50, 51])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    engine.adopt(1)
    run_turns(engine, [TurnRequest(group, [0], None, max_tokens=4)])
    c, s = group.completions[0], group.samples[0]
    first = c.turns[0].start
    assert set(c.versions[:first]) == {0} and set(c.versions[c.turns[0].end:]) == {1}
    assert (s.version_min, s.version_max, s.staleness(3)) == (0, 1, 3)
    ref = reference_logprobs(model, group.prompt_ids, c.tokens)  # the new weights over the whole history
    torch.testing.assert_close(torch.tensor(c.logprobs[c.turns[0].end:]), ref[c.turns[0].end:], atol=1e-4, rtol=1e-4)


def test_the_device_clears_slots_a_stop_string_ended():
    engine = wandering_engine(False, greedy=False, slots=6)
    groups = [new_group(g, 2, [7 + g, 8, 9]) for g in range(3)]

    def check(engine, steps):
        assert set(torch.nonzero(engine.live).flatten().tolist()) == set(engine.running)

    ended = run_turns(engine, [TurnRequest(g, [0, 1], STOP) for g in groups], check)
    assert len(ended) == 6
    assert any(g.completions[0].finish_reason == "stop_string" for g in groups)


def test_turn_requests_refuse_what_the_engine_cannot_serve():
    engine = wandering_engine(False, slots=2)  # 16 new tokens at most, context 48
    with pytest.raises(ValueError, match="cannot fit in 2 slots"):
        engine.submit_turn(TurnRequest(new_group(size=3), [0, 1, 2]))
    group = new_group(size=2)
    group.completions[0].tokens += [5]
    with pytest.raises(ValueError, match="must hold the same tokens"):
        engine.submit_turn(TurnRequest(group, [0, 1]))
    group.completions[0].tokens += [5] * 15
    with pytest.raises(ValueError, match="no room for a turn after 16 tokens"):
        engine.submit_turn(TurnRequest(group, [0]))


def test_a_turn_stops_at_its_own_budget_and_at_the_episode_budget():
    engine = wandering_engine(False, greedy=True, slots=2)
    group = new_group(size=1)
    run_turns(engine, [TurnRequest(group, [0], None, max_tokens=2)])
    c = group.completions[0]
    assert (len(c.tokens), c.finish_reason) == (2, "length")  # the greedy scenario hits no EOS here
    observe(group, 0, [60] * 10)
    run_turns(engine, [TurnRequest(group, [0], None, max_tokens=50)])
    # generation.max_new_tokens (16) bounds the whole episode, observations included
    assert (len(c.tokens), c.finish_reason) == (16, "length")
