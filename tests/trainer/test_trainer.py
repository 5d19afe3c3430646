"""Trainer pieces: packing, chunked log-probs, the log-linear proximal policy, the step itself."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from layout_helpers import assert_layout_equals_padded

from aioareal import losses
from aioareal.config import load_config
from aioareal.group import Completion, Example, Group, Sample
from aioareal.models import random_model
from aioareal.trainer import Trainer, train_step
from aioareal.trainer.batching import Layouts, PromptShare, collate, pack, plan
from aioareal.trainer.logprobs import token_logprobs
from aioareal.trainer.objective import loglinear_prox
from aioareal.trainer.trainer import assign_advantages


@settings(max_examples=200, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=80), budget=st.integers(1, 4000))
def test_property_packing_covers_every_sample_once_within_budget(lengths, budget):
    batches = plan(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= budget
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat)  # similar lengths share a micro-batch


def _sample(prompt, tokens, versions=None):
    versions = versions or [0] * len(tokens)
    return Sample(prompt, Completion(tokens, [-0.1 * (i + 1) for i in range(len(tokens))], versions, "stop"), 1.0)


def test_collate_aligns_targets_with_behaviour_logprobs():
    mb = collate([_sample([5, 6, 7], [8, 9]), _sample([5], [10, 11, 12], [3, 4, 4])], pad_id=0,
                 device=torch.device("cpu"))
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 10, 11, 12, 0]]
    # Column t predicts input_ids[:, t + 1]: completion targets sit at prompt_len - 1 onwards.
    assert mb.loss_mask.tolist() == [[False, False, True, True], [True, True, True, False]]
    torch.testing.assert_close(mb.behav_logp[0, 2:], torch.tensor([-0.1, -0.2]))
    assert mb.versions[1, :3].tolist() == [3.0, 4.0, 4.0]
    assert (mb.real_tokens, mb.completion_tokens) == (9, 5)
    halves = mb.halves()
    assert [h.input_ids.shape[0] for h in halves] == [1, 1] and sum(h.completion_tokens for h in halves) == 5


@pytest.mark.parametrize("keep_logits", [True, False])  # small vocabularies keep them; large ones recompute
def test_chunked_logprobs_equal_naive_full_vocabulary_ones(keep_logits, monkeypatch):
    import aioareal.trainer.logprobs as logprobs

    monkeypatch.setattr(logprobs, "KEEP_LOGITS", 1 << 30 if keep_logits else 0)
    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=1)
    samples = [_sample(list(range(4, 4 + p)), list(range(20, 20 + n))) for p, n in ((3, 5), (6, 2), (1, 9))]
    mb = pack(samples, budget=10_000, pad_id=0, device=torch.device("cpu"))[0]
    chunked, entropy = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature=0.7, chunk=3)
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float() / 0.7
    naive = torch.log_softmax(logits, -1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1) * mb.loss_mask
    torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=1e-5)
    grad_chunked = torch.autograd.grad(chunked.sum(), model.lm_head.weight)[0]
    grad_naive = torch.autograd.grad(naive.sum(), model.lm_head.weight)[0]
    torch.testing.assert_close(grad_chunked, grad_naive, atol=1e-5, rtol=1e-4)
    assert (entropy[mb.loss_mask] > 0).all() and (entropy[~mb.loss_mask] == 0).all()


def test_shared_prompt_logprobs_and_gradients_equal_the_padded_path():
    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=2)
    # Two groups with prompts of different lengths, completions of 1 to 5 tokens, rows interleaved.
    a, b = [4, 5, 6, 7, 8], [9, 10]
    samples = [_sample(a, [20, 21, 22]), _sample(b, [23]), _sample(a, [24, 25, 26, 27, 28]),
               _sample(b, [29, 30]), _sample(a, [31])]
    mb = collate(samples, pad_id=0, device=torch.device("cpu"), layouts=Layouts(share=True))
    share = mb.layout
    assert isinstance(share, PromptShare) and share.prompt_ids.shape == (2, 5) and share.input_ids.shape == (5, 4)
    assert_layout_equals_padded(model, mb, share, chunk=3)
    assert all(h.layout is None for h in mb.halves())  # after an OOM the halves take the padded path


def test_loglinear_prox_is_exact_at_both_ends():
    logp, behav = torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-1.5, -1.0, -3.0])
    versions = torch.tensor([5.0, 3.0, 4.0])
    # theta == prox: the proximal policy is the current one.
    torch.testing.assert_close(loglinear_prox(logp, behav, versions, prox_version=5, theta_version=5), logp)
    # A token sampled by the proximal version itself: pi_prox = pi_behav.
    out = loglinear_prox(logp, behav, versions, prox_version=5, theta_version=5.5)
    assert out[0] == behav[0]
    # Halfway in version between behaviour (3) and theta (5.5) at prox 4.25: halfway in log space.
    out = loglinear_prox(logp[:1], behav[:1], torch.tensor([3.0]), prox_version=4.25, theta_version=5.5)
    torch.testing.assert_close(out, behav[:1] + 0.5 * (logp[:1] - behav[:1]))


def _groups(n_groups=2, g=4):
    gen = torch.Generator().manual_seed(0)
    groups = []
    for gid in range(n_groups):
        group = Group(gid, [4, 5, 6], g, Example(str(gid), "q", "a"))
        for i in range(g):
            tokens = torch.randint(10, 100, (3 + i,), generator=gen).tolist()
            group.samples.append(Sample([4, 5, 6], Completion(tokens, [-2.0] * len(tokens), [0] * len(tokens), "stop"),
                                        float(i % 2)))
        groups.append(group)
    return groups


@pytest.mark.parametrize("objective", ["ppo", "decoupled", "dg"])
def test_trainer_step_updates_the_weights_and_reports(objective):
    config = load_config(overrides=[f"algo.objective={objective}", "algo.minibatches=2", "algo.ppo_epochs=2",
                                    "algo.batch_groups=2", "algo.group_size=4", "algo.kl_coef=0.1"])
    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=1)
    ref = random_model("tiny", torch.float32, torch.device("cpu"), seed=1).requires_grad_(False)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, config.algo, config.train, pad_id=0, ref_model=ref)
    kl, tokens, accumulate = [], [], trainer._accumulate

    def accumulate_and_measure(part, *args):  # k3 KL by hand, at the weights each update starts from
        with torch.no_grad():
            for mb in part:
                d = (trainer._logprobs(ref, mb)[0].double() - trainer._logprobs(model, mb)[0].double())
                kl.append(float(((d.exp() - d - 1) * mb.loss_mask).sum()))
                tokens.append(int(mb.loss_mask.sum()))
        accumulate(part, *args)

    trainer._accumulate = accumulate_and_measure
    metrics = train_step(trainer, _groups())
    assert trainer.version == 1
    assert trainer.optimizer.state[next(model.parameters())]["step"] == 4  # 2 mini-batches x 2 epochs
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert metrics["grad_norm"] > 0
    # Each mini-batch is one group: rows of 3 prompt + 3..6 completion tokens, padded to 9 wide.
    assert metrics["train_tokens"] == 2 * (6 + 7 + 8 + 9) and metrics["padding_frac"] == pytest.approx(1 - 30 / 36)
    # The policy starts equal to the reference: no KL in the first update, some in the three after it;
    # the reported figure is the token mean of the hand-computed k3 over all four updates.
    assert len(kl) == 4 and kl[0] == 0 and min(kl[1:]) > 0
    assert metrics["kl"] == pytest.approx(sum(kl) / sum(tokens), rel=1e-3)
    assert ("capped_frac" in metrics) == (objective == "decoupled")
    assert ("dg_gate_mean" in metrics) == (objective == "dg")


def _decoupled_step(config, recompute: bool):
    """One step from the same weights and groups: its metrics, the weights after it, and how many
    trainer forwards it ran (a recomputing pass, where asked, fills pi_prox outside that count)."""
    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=1)
    trainer = Trainer(model, config.algo, config.train, pad_id=0)
    forwards, logprobs, fill = [], trainer._logprobs, trainer.fill_fixed_logprobs
    trainer._logprobs = lambda *a, **kw: forwards.append(1) or logprobs(*a, **kw)

    def fill_and_recompute(packed):  # the pass the trainer used to pay before its one update
        fill(packed)
        with torch.no_grad():
            for mb in (mb for part in packed for mb in part):
                mb.prox_logp = logprobs(model, mb)[0].float()

    if recompute:
        trainer.fill_fixed_logprobs = fill_and_recompute
    metrics = train_step(trainer, _groups())
    return metrics, [p.detach().clone() for p in model.parameters()], len(forwards)


def test_decoupled_with_one_update_a_step_spends_no_forward_on_pi_prox_and_updates_as_a_recomputed_one():
    """pi_prox is the policy at the step's start: with one update a step that is the update's own
    forward, detached, so no pass is spent on it. The update equals the one a recomputing pass gives."""
    config = load_config(overrides=["algo.objective=decoupled", "algo.prox=recompute", "algo.batch_groups=2",
                                    "algo.group_size=4"])
    skipped, after, n = _decoupled_step(config, recompute=False)
    recomputed, want, n_recomputed = _decoupled_step(config, recompute=True)
    assert n == skipped["micro_batches"] and n_recomputed == n  # the loss forwards alone
    for a, b in zip(after, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert skipped["loss"] == pytest.approx(recomputed["loss"], rel=1e-5, abs=1e-7)
    assert skipped["behav_weight_max"] == pytest.approx(recomputed["behav_weight_max"], rel=1e-5)


def test_fp16_loss_scaler_skips_count_and_leave_the_schedule_alone():
    from aioareal.trainer.trainer import MAX_CONSECUTIVE_SKIPS, SCALER_CALIBRATION_SKIPS, NonFiniteError

    config = load_config(overrides=["model.name=random:tiny", "algo.warmup_steps=10"])
    model = random_model("tiny", torch.float32, torch.device("cpu"))
    trainer = Trainer(model, config.algo, config.train, pad_id=0)
    trainer.scaler = torch.amp.GradScaler("cpu")  # as on a fp16 GPU (V100-class): same code path
    param = next(model.parameters())

    def attempt(grad_value: float) -> None:
        trainer.scaler.scale(torch.ones(()))  # as a backward of a scaled loss would (sets up the scale)
        for p in model.parameters():
            p.grad = torch.full_like(p, grad_value)
        trainer.scaler.unscale_(trainer.optimizer)
        trainer._optimizer_step(losses.grad_norm_clip(model.parameters(), 1.0))

    before, scale = param.detach().clone(), trainer.scaler.get_scale()
    attempt(float("inf"))
    assert torch.equal(param, before) and trainer.skipped_updates == 1
    assert trainer.scheduler.last_epoch == 0 and trainer.scaler.get_scale() == scale / 2
    attempt(1.0)
    assert not torch.equal(param, before) and trainer.consecutive_skips == 0 and trainer.scheduler.last_epoch == 1
    with pytest.raises(NonFiniteError):
        for _ in range(MAX_CONSECUTIVE_SKIPS + SCALER_CALIBRATION_SKIPS):
            attempt(float("nan"))
    assert trainer.skipped_updates == 1 + MAX_CONSECUTIVE_SKIPS + SCALER_CALIBRATION_SKIPS


def test_drop_constant_groups_stops_a_run_that_can_never_fill_a_batch(tmp_path):
    """Random weights never answer right, so every group's rewards are all 0 and the filter (now a
    config key) rejects them all: the run must end with a clear error, not generate forever."""
    from aioareal.errors import UserError
    from aioareal.run.recipe import train

    config = load_config(overrides=["model.name=random:tiny", "train.steps=2", "algo.batch_groups=2",
                                    "eval.every=0", "data.eval_size=8", "algo.drop_constant_groups=true",
                                    "algo.group_size=2", "generation.max_new_tokens=4"],  # 201 cheap groups
                         flags={"run.run_dir": str(tmp_path / "run")})
    with pytest.raises(UserError, match="drop_constant_groups rejected 201 groups in a row"):
        train(config, log=lambda *_: None, printer=lambda row: None)


def test_behaviour_stats_by_hand():
    """The explanatory off-policy metrics on hand-picked numbers: w = pi / pi_behav per token."""
    from aioareal.trainer.objective import behaviour_stats

    mb = collate([_sample([5], [8, 9, 10], [2, 3, 3]), _sample([5], [11], [1])], pad_id=0, device=torch.device("cpu"))
    # Targets sit at columns 0..2 (row 0) and 0 (row 1); behaviour log-probs -0.1, -0.2, -0.3 and -0.1.
    log_w = torch.tensor([[0.0, 1.0, -1.0], [3.0, 5.0, 5.0]])  # off-mask entries must not count
    stats = behaviour_stats(load_config().algo, mb, mb.behav_logp + log_w, prox_version=3)
    e = torch.e
    torch.testing.assert_close(stats["behav_weight"], torch.tensor(1 + e + 1 / e + e**3))
    torch.testing.assert_close(stats["behav_weight_max"], torch.tensor(e**3))
    assert stats["behav_outside_clip"] == 3  # all but the w = 1 token leave [0.8, 1.2]
    assert stats["stale_tokens"] == 2  # versions 2 and 1 are older than the step's version 3


def test_step_reports_behaviour_weights_max_over_micro_batches():
    """Decoupled, one update: w = pi_prox / pi_behav with pi_prox the model before the step. The max
    must be the max over every micro-batch (not their sum), the mean over every trained token, the
    capped fractions those of the tokens with w > 5 (and, of those, A < 0)."""
    config = load_config(overrides=["algo.objective=decoupled", "algo.batch_groups=2", "algo.group_size=4",
                                    "train.micro_batch_tokens=20"])
    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=1)
    trainer = Trainer(model, config.algo, config.train, pad_id=0)
    trainer.version = 1  # samples of version 0: every token is one version stale
    groups = _groups()
    for i, sample in enumerate(s for g in groups for s in g.samples):  # behaviour -8 (w > 5) or -2 (w < 1)
        sample.completion.logprobs = [-8.0 if (i + j) % 3 == 0 else -2.0 for j in range(len(sample.tokens))]
    assign_advantages(groups, std_norm=True)
    parts = trainer.pack(groups)
    assert sum(len(p) for p in parts) > 1  # several micro-batches, or the max test means nothing
    with torch.no_grad():  # the random model's log-probs are about -5
        w = torch.cat([(trainer._logprobs(model, mb)[0] - mb.behav_logp)[mb.loss_mask].exp()
                       for part in parts for mb in part])
    adv = torch.cat([mb.advantages[:, None].expand_as(mb.loss_mask)[mb.loss_mask] for part in parts for mb in part])
    assert ((w > 5) & (adv < 0)).any() and ((w > 5) & (adv > 0)).any()  # both kinds of capped token occur
    metrics = train_step(trainer, groups)
    assert metrics["behav_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-4)
    assert metrics["behav_weight_max"] == pytest.approx(float(w.max()), rel=1e-4)
    assert metrics["capped_frac"] == pytest.approx(float((w > 5).float().mean()), abs=1e-6)
    assert metrics["capped_neg_frac"] == pytest.approx(float(((w > 5) & (adv < 0)).float().mean()), abs=1e-6)
    assert metrics["stale_token_frac"] == 1.0


def test_computed_positions_count_padding_and_shared_prompts_once():
    from aioareal.trainer.batching import computed_positions

    a, b = [4, 5, 6], [7, 8]
    samples = [_sample(a, [1] * 2), _sample(a, [1] * 5), _sample(b, [1] * 3)]
    # One micro-batch (budget 100): 3 rows x the longest row (3 + 5) padded; shared: prompts 2 x 3
    # wide, then 3 completions x 5 wide.
    assert computed_positions(samples, 100) == 3 * 8
    assert computed_positions(samples, 100, Layouts(share=True)) == 2 * 3 + 3 * 5
    # Budget 10: plan() cuts [5, 5] | [8]: 2 x 5 + 1 x 8 padded.
    assert computed_positions(samples, 10) == 2 * 5 + 8
