"""An unstaged weight sync (weightsync/full.py): for a CPU generator that is idle whenever the
trainer publishes, `publish` writes the live parameters and `apply` only moves the version."""
from __future__ import annotations

import pytest
import torch

from aioareal.models import random_model
from aioareal.weightsync.full import WeightSync

CPU = torch.device("cpu")


def _pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    return random_model("tiny", torch.float32, CPU, seed=1), random_model("tiny", torch.bfloat16, CPU, seed=2)


def test_publish_writes_the_generator_at_once_and_apply_moves_only_the_version():
    trainer, gen = _pair()
    sync = WeightSync(trainer, gen, staged=False)
    live = [p.data_ptr() for p in gen.parameters()]
    assert [s.data_ptr() for s in sync.staging] == live  # no copy of the generator's weights
    sync.publish(1)
    for (name, master), p in zip(trainer.named_parameters(), gen.parameters()):
        assert torch.equal(p, master.to(torch.bfloat16)), name  # written before any apply
    assert sync.pending
    assert sync.apply() == (1, None)
    assert not sync.pending and [p.data_ptr() for p in gen.parameters()] == live


def test_unstaged_and_staged_syncs_leave_the_same_weights():
    trainer, gen = _pair()
    _, other = _pair()
    for model, staged in ((gen, False), (other, True)):
        sync = WeightSync(trainer, model, staged=staged)
        sync.publish(3)
        assert sync.apply() == (3, None)
    assert sync.bytes_per_publish == WeightSync(trainer, gen, staged=False).bytes_per_publish
    for a, b in zip(gen.parameters(), other.parameters()):
        assert torch.equal(a, b)


def test_an_unstaged_sync_refuses_a_generator_off_the_cpu():
    trainer, elsewhere = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, device="meta")
    with pytest.raises(ValueError, match="CPU generator"):
        WeightSync(trainer, elsewhere, staged=False)
    WeightSync(trainer, elsewhere)  # staged, it may write any device


def test_release_frees_the_generators_weights_until_publish_writes_them_whole():
    """Through an engine's fused projections (views of one storage) and the tied head: after a
    release and a publish the engine computes with the trainer's weights, as an engine built on
    them does."""
    from engine_helpers import generate, random_groups

    from aioareal.generation import Engine, EngineOptions, SamplingParams

    trainer, gen = _pair()
    engine = Engine(gen, [1], EngineOptions(8, 40, SamplingParams(max_new_tokens=6), seed=5))
    sync = WeightSync(trainer, gen, staged=False)
    sync.release()
    assert all(p.untyped_storage().nbytes() == 0 for p in gen.parameters())
    sync.release()  # twice is once
    sync.publish(1)
    assert sync.apply() == (1, None)
    engine.adopt(1)
    fresh = Engine(random_model("tiny", torch.bfloat16, CPU, seed=2), [1],
                   EngineOptions(8, 40, SamplingParams(max_new_tokens=6), seed=5))
    staged = WeightSync(trainer, fresh.model)
    staged.publish(1)
    staged.apply()
    fresh.adopt(1)
    tokens = [[c.tokens for r in generate(e, random_groups([2] * 3)) for c in r.completions] for e in (engine, fresh)]
    assert tokens[0] == tokens[1]


def test_restore_after_a_failed_step_gives_the_masters_back_without_a_new_version():
    trainer, gen = _pair()
    sync = WeightSync(trainer, gen, staged=False)
    sync.release()
    sync.restore()
    assert not sync.pending
    for master, p in zip(trainer.parameters(), gen.parameters()):
        assert torch.equal(p, master.to(torch.bfloat16))
    sync.restore()  # nothing released: nothing to do


def test_a_staged_sync_releases_nothing():
    trainer, gen = _pair()
    sync = WeightSync(trainer, gen)
    sync.release()
    assert all(p.untyped_storage().nbytes() > 0 for p in gen.parameters())
