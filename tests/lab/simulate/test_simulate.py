"""`simulate`: the profile format and its fits, the profile-costed workers driving the real
orchestrator (exact step times, the macro-step fast path against single steps, contention,
lockstep cells), derived profiles, and the command line."""
from __future__ import annotations

import asyncio
import json

import pytest

from aioareal.cli import main
from aioareal.errors import UserError
from aioareal.lab.simulate.contention import Device, Topology
from aioareal.lab.simulate.cost_profile import (
    Contention,
    DecodeCost,
    PrefillCost,
    Profile,
    TrainCost,
    fit,
    load_profile,
    profile_from_dict,
)
from aioareal.lab.simulate.gpus import GPUS, derive
from aioareal.lab.simulate.lengths import length_sampler, sampler
from aioareal.lab.simulate.published import readme_h100
from aioareal.lab.simulate.simulated_run import Setting, simulate
from aioareal.lab.simulate.virtualclock import run_virtual


def profile(decode=(0.01, 0.0, 0.0), prefill=(0.0, 0.0, 0.0), train=(1.0, 0.0), contention=(1.0, 1.0),
            publish=0.0, adopt=0.0) -> Profile:
    return Profile("test", "measured", "cpu", "tiny", "float32", DecodeCost(*decode), PrefillCost(*prefill),
                   TrainCost(*train), publish, adopt, 0.0, Contention(*contention), 1_000_000, link_gbps=10.0)


def run(p: Profile, mode: str, k: int, lengths=lambda rng: 10, topology=None, **setting):
    s = Setting(**{"batch_groups": 2, "group_size": 2, "prompt_len": 4, "steps": 6, "warmup_steps": 1,
                   "reward_s": 0.0, **setting})
    return simulate(p, s, topology or Topology(), lengths, mode, k)


def test_fit_recovers_coefficients_and_never_goes_negative():
    points = [[n, s, 0.002 + 1e-5 * n + 3e-8 * n * s] for n in (8, 32, 64) for s in (40, 300, 900)]
    d = DecodeCost.fitted(points)
    assert (d.a, d.b, d.c) == pytest.approx((0.002, 1e-5, 3e-8))
    # y falls with x: the slope would be negative, so it is dropped and a constant fitted instead,
    # the one with the least squared relative error: sum(1/y) / sum(1/y^2).
    constant = (1 / 3 + 1 / 2 + 1) / (1 / 9 + 1 / 4 + 1)
    assert fit([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]], [3.0, 2.0, 1.0]) == pytest.approx([constant, 0.0])


def test_profile_round_trips_and_bad_files_name_the_field(tmp_path):
    path = tmp_path / "p.json"
    profile(decode=(0.01, 1e-4, 1e-8)).save(path)
    assert load_profile(path) == profile(decode=(0.01, 1e-4, 1e-8))
    raw = json.loads(path.read_text())
    for change, message in ((lambda r: r.pop("train"), r"missing \[.train.\]"),
                            (lambda r: r["decode"].update(a=-1.0), "decode.a"),
                            (lambda r: r["contention"].update(gen=0.5), "contention factors"),
                            (lambda r: r.update(format="x"), "format")):
        bad = json.loads(json.dumps(raw))
        change(bad)
        with pytest.raises(UserError, match=message):
            profile_from_dict(bad, "p.json")
    with pytest.raises(UserError, match="no such file"):
        load_profile(tmp_path / "missing.json")


def test_sync_step_time_is_the_sum_of_its_parts():
    # Fixed length 10: the admission step prefills (token 1) and decodes (token 2), then 8 more
    # decode steps; then one train step. Sync never overlaps them.
    p = profile(decode=(0.01, 0.001, 0.0), prefill=(0.005, 0.0, 0.0), train=(1.0, 0.0), publish=0.002)
    r = run(p, "sync", 0)
    decode = 9 * (0.01 + 0.001 * 4)  # 4 slots decoded
    step = 0.005 + decode + 1.002
    assert r.s_per_step == pytest.approx(step) and r.samples_per_s == pytest.approx(4 / step)  # B x G = 4 a step
    assert r.train_idle == pytest.approx((0.005 + decode) / r.s_per_step)
    assert r.staleness == {0: 6 * 4} and r.len_mean == 10


def test_a_measured_train_cost_counts_the_positions_the_trainer_computes():
    """Profiles from `bench profile` count token positions (padding included, prompts once per group
    with shared prompts: batching.computed_positions); published ones count real tokens."""
    import dataclasses

    tokens = profile(train=(0.0, 1e-3))
    positions = dataclasses.replace(tokens, train=TrainCost(0.0, 1e-3, unit="positions", budget=10_000, share=True))
    decode = 9 * 0.01  # fixed length 10: prefill gives token 1, nine decode steps the rest
    # B=2 groups of G=2 with 4-token prompts: 4 x 14 = 56 real tokens; 2 x 4 + 4 x 10 = 48 positions.
    assert run(tokens, "sync", 0).s_per_step == pytest.approx(decode + 0.056)
    assert run(positions, "sync", 0).s_per_step == pytest.approx(decode + 0.048)
    with pytest.raises(UserError, match="train.unit"):
        profile_from_dict({**json.loads(positions.to_json()), "train": {"a": 0, "b": 1e-3, "unit": "positions"}}, "p")


def test_a_cpu_engine_decodes_running_slots_a_gpu_one_every_slot_up_to_the_highest():
    """Each group holds a 2-token and a 10-token sample; after the first decode step the short ones
    are done. The CPU engine then decodes 2 rows (engine._decode_live), a GPU one still slots 0..3."""
    import dataclasses
    import itertools

    cpu = profile(decode=(0.01, 0.001, 0.0), train=(1.0, 0.0))
    gpu = dataclasses.replace(cpu, device="cuda (test)")
    times = {}
    for p in (cpu, gpu):
        lengths = itertools.cycle([2, 10])
        times[p.device] = run(p, "sync", 0, lengths=lambda rng, lengths=lengths: next(lengths)).s_per_step
    assert times["cpu"] == pytest.approx(9 * 0.01 + 0.001 * (4 + 8 * 2) + 1.0)
    assert times["cuda (test)"] == pytest.approx(9 * 0.01 + 0.001 * 9 * 4 + 1.0)


@pytest.mark.parametrize("mode, k", [("sync", 0), ("one-step", 1), ("async", 1), ("async", 3)])
def test_macro_steps_match_single_decode_steps(mode, k):
    """The fast path (every decode step to the next sequence end in one sleep, cut short by new
    versions or contention changes) against one decode step per call, on long-tailed lengths."""
    p = profile(decode=(0.004, 2e-4, 1e-6), prefill=(0.003, 1e-5, 0.0), train=(0.2, 1e-4), contention=(1.5, 2.0),
                publish=0.01, adopt=0.001)
    lengths = length_sampler("gsm8k", 40, 160)
    fast = run(p, mode, k, lengths, steps=12, batch_groups=3, group_size=4)
    slow = run(p, mode, k, lengths, steps=12, batch_groups=3, group_size=4, single_steps=True)
    assert fast.staleness == slow.staleness and fast.interrupted == slow.interrupted
    assert fast.s_per_step == pytest.approx(slow.s_per_step, rel=1e-9)
    # Busy time is counted when a call returns: at the first and last timed step a longer call may
    # still be open, so idle fractions agree only to about one macro step over the timed window
    # (async K=3 here: 0.0099 apart with every slot decoded, 0.0100 with the CPU's live slots).
    assert fast.gen_idle == pytest.approx(slow.gen_idle, abs=0.015)
    assert max(fast.staleness) <= k


def test_contention_slows_work_only_while_the_other_side_works():
    p = profile(contention=(3.0, 2.0))

    async def go(shared: bool) -> float:
        device = Device(p, shared)
        loop = asyncio.get_running_loop()

        async def generator() -> None:
            device.set_active("gen", True)
            await asyncio.sleep(0.5)
            device.set_active("gen", False)

        task = asyncio.create_task(generator())
        await device.work("train", 1.0)  # 0.5 s at half speed, then 0.75 s of work alone
        await task
        return loop.time()

    assert run_virtual(go(True)) == pytest.approx(1.25)
    assert run_virtual(go(False)) == pytest.approx(1.0)  # two devices: no contention


def test_async_hides_generation_and_cells_step_in_lockstep():
    p = profile(decode=(0.01, 0.0, 0.0), train=(0.3, 0.0))
    lengths = length_sampler("gsm8k", 20, 80)
    sync, fast = run(p, "sync", 0, lengths, steps=20), run(p, "async", 2, lengths, steps=20)
    assert fast.samples_per_s > sync.samples_per_s and max(fast.staleness) <= 2
    # Two identical cells (fixed lengths) in sync mode: each step is one cell's step plus the
    # all-reduce of 1M fp32 gradients (2 x 4 MB x 1/2 over 10 GB/s, plus 2 hops of 10 us).
    two_cells = Topology(cells=2, link_gbps=10.0)
    assert two_cells.allreduce_s(p) == pytest.approx(4e6 / 10e9 + 2e-5)
    one, two = run(p, "sync", 0), run(p, "sync", 0, topology=two_cells)
    step = one.s_per_step + two_cells.allreduce_s(p)
    assert two.s_per_step == pytest.approx(step)
    assert two.samples_per_s == pytest.approx(2 * 4 / step)  # both cells' samples count


def test_derived_profiles_scale_each_part_by_its_bound():
    h100 = readme_h100()
    same = derive(h100, "h100", "readme")
    assert (same.decode.a, same.train.b) == pytest.approx((h100.decode.a, h100.train.b))
    v100 = derive(h100, "v100", "readme")
    assert v100.kind == "derived" and v100.dtype == "float16" and v100.link_gbps == GPUS["v100"].link_gbps
    assert v100.decode.c == pytest.approx(h100.decode.c * 3350 / 900)  # attention: bandwidth-bound
    assert v100.train.b == pytest.approx(h100.train.b * 989 / 125)  # training tokens: FLOP-bound
    assert v100.reward_s == h100.reward_s  # the host's
    with pytest.raises(UserError, match="unknown"):
        derive(h100, "tpu", "readme")


def test_lengths_of_a_run_and_bad_specs(tmp_path):
    rows = [{"step": 1, "length": n} for n in (5, 7, 300)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    draw, label = sampler(str(tmp_path), 0.0, cap=100)
    import random

    rng = random.Random(0)
    assert {draw(rng) for _ in range(200)} == {5, 7, 100} and "3 lengths" in label
    with pytest.raises(UserError, match="samples.jsonl"):
        sampler(str(tmp_path / "nope"), 10, 10)


def test_command_prints_a_table_a_json_line_and_a_plot(capsys, tmp_path):
    path = tmp_path / "p.json"
    profile(decode=(0.01, 1e-4, 1e-7), train=(0.5, 1e-5)).save(path)
    plot = tmp_path / "speedup.png"
    assert main(["simulate", "--profile", str(path), "--steps", "8", "--max-staleness", "1,2",
                 "--batch-groups", "2", "--group-size", "2", "--mean-len", "20", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    line = json.loads(out.strip().splitlines()[-1])
    assert [k for k in line if k.endswith("_samples_s")] == ["sync_samples_s", "one_step_samples_s",
                                                            "async_k1_samples_s", "async_k2_samples_s"]
    assert all(line[k] > 0 for k in line if k.endswith("_samples_s"))
    assert "staleness" in out and plot.stat().st_size > 0


def test_against_a_bench_line_predicts_the_same_setting(capsys, tmp_path):
    path = tmp_path / "p.json"
    profile(decode=(0.01, 0.0, 0.0), train=(1.0, 0.0)).save(path)
    bench = {"bench": "e2e", "batch_groups": 2, "group_size": 2, "prompt_len": 4, "slots": 4, "steps": 3,
             "warmup_steps": 1, "seed": 0, "length_dist": "fixed", "mean_len": 10.0, "max_new_tokens": 10,
             "max_staleness": 2, "sync_samples_s": 2.0, "sync_gen_idle": 0.1, "sync_train_idle": 0.9}
    (tmp_path / "e2e.jsonl").write_text(json.dumps(bench) + "\n")
    assert main(["simulate", "--profile", str(path), "--against", str(tmp_path / "e2e.jsonl")]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    predicted = 4 / (9 * 0.01 + 1.0)  # 9 decode steps (the prefill makes token 1, free here), a 1 s train step
    assert [r["mode"] for r in rows] == ["sync"]
    assert rows[0]["predicted_samples_s"] == pytest.approx(predicted)
    assert rows[0]["error"] == pytest.approx(predicted / 2.0 - 1)
    assert rows[0]["predicted_interrupted"] == 0 and rows[0]["measured_interrupted"] is None  # not in that line
    # A line with every mode: one row each, in the bench's order, async at the line's K.
    bench.update(one_step_samples_s=2.5, async_samples_s=3.0, async_interrupted=0.25)
    (tmp_path / "e2e.jsonl").write_text(json.dumps(bench) + "\n")
    assert main(["simulate", "--profile", str(path), "--against", str(tmp_path / "e2e.jsonl")]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [r["mode"] for r in rows] == ["sync", "one-step", "async"]
    assert [r["measured_samples_s"] for r in rows] == [2.0, 2.5, 3.0] and rows[2]["measured_interrupted"] == 0.25
    assert rows[1]["predicted_samples_s"] > rows[0]["predicted_samples_s"]  # one-step overlaps the two sides


@pytest.mark.parametrize("args, expected", [
    (["--profile", "nope.json"], "error: --profile nope.json: no such file"),
    (["--profile", "configs/profiles/h100-qwen2.5-0.5b.json", "--max-staleness", "a"], "error: --max-staleness a"),
    (["--profile", "configs/profiles/h100-qwen2.5-0.5b.json", "--lengths", "nope"], "error: --lengths nope"),
])
def test_bad_options_are_one_line_errors(capsys, args, expected):
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected) and len(err.splitlines()) == 1
