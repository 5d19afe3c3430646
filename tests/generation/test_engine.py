"""The engine against a plain full forward pass of the same Hugging Face model."""
import pytest
import torch
from engine_helpers import adopt_after, generate, random_groups, reference_logprobs, tiny

from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.generation.sampling import sample
from aioareal.group import Group


@pytest.mark.parametrize("adopt_at, recompute", [(None, True), (4, True), (4, False)])
def test_logprobs_match_full_forward(adopt_at, recompute):
    model = tiny()
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=16)
    # Fewer slots than sequences: slots are freed and refilled mid-run (continuous batching).
    engine = Engine(model, [1], EngineOptions(num_slots=10, max_len=40, params=params, seed=1, recompute_kv=recompute))
    results = generate(engine, random_groups([3] * 7), adopt_after(adopt_at) if adopt_at else None)
    for r in results:
        assert len(r.completions) == 3
        for c in r.completions:
            assert 1 <= len(c.tokens) <= 16 and len(c.logprobs) == len(c.tokens) == len(c.versions)
            assert c.finish_reason == ("stop" if c.tokens[-1] == 1 else "length")
            ref = reference_logprobs(model, r.prompt_ids, c.tokens, params.temperature)
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=1e-4)
    versions = {v for r in results for c in r.completions for v in c.versions}
    assert versions == ({0} if adopt_at is None else {0, 1})


def test_interrupted_sequences_record_both_versions():
    engine = Engine(tiny(), [], EngineOptions(4, 40, SamplingParams(max_new_tokens=10), seed=0))
    results = generate(engine, random_groups([4]), adopt_after(3))
    for c in results[0].completions:
        assert c.versions[0] == 0 and c.versions[-1] == 1 and len(c.tokens) == 10


def test_greedy_matches_argmax_of_full_forward():
    model = tiny()
    engine = Engine(model, [1], EngineOptions(4, 40, SamplingParams(greedy=True, max_new_tokens=8)))
    results = generate(engine, random_groups([1] * 4))
    for r in results:
        ids = list(r.prompt_ids)
        for token in r.completions[0].tokens:
            with torch.no_grad():
                expected = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            assert token == expected
            ids.append(token)


def test_same_seed_same_samples():
    outs = []
    for seed in (5, 5, 6):  # the same seed twice; another, which must draw differently (the seed is used)
        engine = Engine(tiny(), [1], EngineOptions(8, 40, SamplingParams(max_new_tokens=6), seed=seed))
        outs.append([c.tokens for r in generate(engine, random_groups([2] * 4)) for c in r.completions])
    assert outs[0] == outs[1] and outs[0] != outs[2]


def test_sampling_distribution_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(20000, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logp = sample(logits, SamplingParams(temperature=1.0), gen)
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.015, rtol=0)
    torch.testing.assert_close(logp[:4].exp(), torch.tensor([0.5, 0.3, 0.15, 0.05])[tokens[:4]])
    tokens, _ = sample(logits, SamplingParams(temperature=1.0, top_p=0.7), gen)
    assert set(tokens.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.7; the tail is cut


def test_rejects_prompt_longer_than_context():
    engine = Engine(tiny(), [1], EngineOptions(num_slots=2, max_len=12, params=SamplingParams(max_new_tokens=8)))
    with pytest.raises(ValueError, match="exceeds the engine context"):
        engine.submit(Group(0, list(range(4, 10)), size=1))


def test_forced_lengths_ignore_eos():
    engine = Engine(tiny(), list(range(128)), EngineOptions(6, 40, SamplingParams(max_new_tokens=12), seed=0))
    results = generate(engine, [Group(0, [5, 6, 7], size=3, forced_lengths=[1, 5, 30])])
    assert [len(c.tokens) for c in results[0].completions] == [1, 5, 12]  # capped by max_new_tokens


def test_cpu_decodes_only_running_slots_with_the_same_results(monkeypatch):
    """Finished slots drop out of the CPU's decode (engine._decode_live); greedy tokens and their
    logprobs equal those of decoding every slot."""
    params = SamplingParams(max_new_tokens=12, greedy=True)
    requests = [Group(0, [5, 6, 7], size=4, forced_lengths=[1, 3, 7, 12]),
                Group(1, [9, 8], size=4, forced_lengths=[2, 12, 5, 4])]

    def run(live: bool):
        engine = Engine(tiny(), [1], EngineOptions(num_slots=8, max_len=32, params=params))
        calls = []
        if live:
            monkeypatch.setattr(engine, "_decode_live",
                                lambda n, span: calls.append(n) or Engine._decode_live(engine, n, span))
        else:
            monkeypatch.setattr(engine, "_decode_live", lambda n, span: engine._decode_into(n, span))
        return {(r.group_id, i): c for r in generate(engine, requests) for i, c in enumerate(r.completions)}, calls

    live, calls = run(True)
    every, _ = run(False)
    assert len(calls) >= 5  # most steps ran with some slots finished
    for key, c in every.items():
        assert live[key].tokens == c.tokens
        torch.testing.assert_close(torch.tensor(live[key].logprobs), torch.tensor(c.logprobs), atol=1e-5, rtol=1e-5)


def test_live_decode_pays_on_short_contexts_or_when_half_the_slots_are_done():
    from aioareal.generation.engine import SHORT_SPAN, live_decode_pays

    assert not live_decode_pays(8, 8, 1)  # nothing finished
    assert live_decode_pays(7, 8, SHORT_SPAN)  # short contexts: gathering their cache rows is cheap
    assert not live_decode_pays(5, 8, SHORT_SPAN + 1) and live_decode_pays(4, 8, 1000)


def test_decode_tokens_count_every_token_but_the_first_of_each_sequence():
    # The counter bench e2e reads from the loop's thread mid-step: decode steps' tokens only, so
    # it never lags a step's admissions (the two-counter difference it replaced went negative).
    engine = Engine(tiny(scale=6.0), [1], EngineOptions(5, 40, SamplingParams(max_new_tokens=9), seed=0))
    seen = []
    results = generate(engine, random_groups([3, 2, 4]),
                       lambda e, _: seen.append((e.tokens_generated, e.decode_tokens)))
    lengths = [len(c.tokens) for r in results for c in r.completions]
    assert len(set(lengths)) > 1  # EOS ends some early, so the count is not a product of sizes
    assert engine.decode_tokens == sum(lengths) - len(lengths) and engine.tokens_generated == sum(lengths)
    assert all(a[1] <= b[1] for a, b in zip(seen, seen[1:]))


def test_an_idle_engine_lets_its_kv_cache_go_and_samples_as_one_that_keeps_it():
    """`idle` frees the cache (sync mode's training step gets its memory); the next batch makes a new
    one and draws what an engine that kept its cache draws."""
    def two_batches(release: bool) -> tuple[list, bool]:
        engine = Engine(tiny(), [1], EngineOptions(8, 40, SamplingParams(max_new_tokens=6), seed=5))
        first = generate(engine, random_groups([2] * 4))
        if release:
            engine.idle()
        freed = engine.cache is None
        second = generate(engine, random_groups([2] * 4, seed=1))
        assert engine.cache is not None
        return [c.tokens for r in first + second for c in r.completions], freed
    kept, kept_freed = two_batches(False)
    released, released_freed = two_batches(True)
    assert released_freed and not kept_freed
    assert released == kept


def test_an_engine_with_sequences_in_flight_keeps_its_kv_cache():
    engine = Engine(tiny(), [1], EngineOptions(4, 40, SamplingParams(max_new_tokens=6), seed=0))
    engine.submit(Group(0, [3, 4, 5], 2, forced_lengths=[6, 6]))
    engine.step()
    engine.idle()
    assert engine.cache is not None and engine.running
