"""`python -m aioareal bench`: each bench runs end to end on the tiny model at toy sizes, ends with one
JSON line of its figures, and `--out` appends that line. Each line is checked once against its
schema (bench_schema.py: exactly its keys, each of the right type and range); the rest asserts what
the bench did. Timings are never asserted (docs/performance.md: a speed claim is a command, not a test)."""
import json
from statistics import fmean

import bench_schema as schema
import pytest

from aioareal.cli import main

TINY = ["--model", "tiny", "--threads", "1"]


def run_bench(capsys, tmp_path, *args: str) -> dict:
    """Run a bench with --out pointing at a file that already holds a line; check it was appended."""
    out = tmp_path / "bench.jsonl"
    out.write_text('{"earlier": true}\n')
    assert main(["bench", *args, *TINY, "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    figures = json.loads(last)
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == {"earlier": True} and json.loads(lines[1]) == figures
    return figures


def test_gen_engine_and_generate_make_the_same_tokens(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "3", "--samples", "2", "--prompt-len", "5",
                  "--new-tokens", "6", "--repeats", "1")
    schema.check(r, schema.GEN)
    assert r["device"] == "cpu" and r["model"] == "random:tiny" and r["dtype"] == "float32"
    assert r["engine_tokens"] == r["generate_tokens"] == 3 * 2 * 6
    assert len(r["engine_s_rounds"]) == len(r["generate_s_rounds"]) == 1
    # tiny: 4 layers x (q, k, v with biases, o, 3 MLP matrices, 2 norms) = 4 x 197,120, + tied 128 x 128
    # embedding + final norm = 804,992 fp32 parameters
    assert r["param_bytes"] == 804_992 * 4
    assert r["kv_bytes_per_token"] == 4 * 2 * 2 * 32 * 4  # tiny: layers * K,V * kv_heads * head_dim * fp32
    # The CPU's bandwidth is the one measured in the rounds; no peak memory measured there; auto
    # overlap is off on the CPU.
    assert r["peak_gbps"] == r["peak_mem_gbps"] and r["engine_peak_mem_gb"] is None
    assert r["engine_ceiling_tok_s"] * r["engine_roofline_frac"] == pytest.approx(r["engine_tok_s"])
    # Decode reads the weights every step: tiny batches are memory-bound; each phase has its roofline.
    assert r["decode_bound"] in ("compute", "memory") and 0 < r["decode_roofline_frac"]
    assert r["prefill_bound"] in ("compute", "memory") and 0 < r["prefill_roofline_frac"]
    assert (r["fused"], r["overlap"], r["shared_prefix"], r["cuda_graphs"]) == (True, False, False, False)


def test_gen_roofline_fraction_with_a_given_peak(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "1", "--samples", "2", "--prompt-len", "3",
                  "--new-tokens", "2", "--repeats", "1", "--slots", "2", "--peak-gbps", "100")
    schema.check(r, schema.GEN)
    assert r["peak_gbps"] == 100 and r["slots"] == 2
    assert None not in (r["engine_roofline_frac"], r["generate_roofline_frac"], r["engine_ceiling_tok_s"])


def test_gen_compares_fused_and_unfused_projections(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "2", "--samples", "2", "--prompt-len", "4",
                  "--new-tokens", "3", "--repeats", "1", "--compare-fusion")
    schema.check(r, schema.GEN, schema.GEN_COMPARE_FUSION)
    assert r["fused"] is True and len(r["unfused_s_rounds"]) == 1
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "1", "--samples", "2", "--prompt-len", "3",
                  "--new-tokens", "2", "--repeats", "1", "--no-fuse")
    schema.check(r, schema.GEN)  # no comparison without --compare-fusion
    assert r["fused"] is False


def test_gen_compares_shared_prefix_and_plain_decode(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "2", "--samples", "3", "--prompt-len", "5",
                  "--new-tokens", "4", "--repeats", "1", "--shared-prefix", "--compare-shared-prefix")
    schema.check(r, schema.GEN, schema.GEN_COMPARE_SHARED_PREFIX)
    assert r["shared_prefix"] is True and r["engine_tokens"] == 2 * 3 * 4


def test_gen_compares_a_common_prefix_prefilled_once_and_whole_prompts(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "3", "--samples", "2", "--prompt-len", "4",
                  "--new-tokens", "3", "--repeats", "1", "--common-prefix", "20", "--compare-common-prefix")
    schema.check(r, schema.GEN, schema.GEN_COMPARE_COMMON_PREFIX)
    assert r["common_prefix"] == 20 and r["engine_tokens"] == 3 * 2 * 3


def test_gen_compares_overlap_on_and_off(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "2", "--samples", "2", "--prompt-len", "4",
                  "--new-tokens", "3", "--repeats", "1", "--compare-overlap")
    schema.check(r, schema.GEN, schema.GEN_COMPARE_OVERLAP)
    assert r["overlap"] is False  # auto: off on the CPU; the flipped twin overlaps
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "1", "--samples", "2", "--prompt-len", "3",
                  "--new-tokens", "2", "--repeats", "1", "--overlap")
    schema.check(r, schema.GEN)  # no comparison without --compare-overlap
    assert r["overlap"] is True and r["engine_tokens"] == 4


def test_train_reports_padding_and_memory(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "train", "--samples", "6", "--prompt-len", "4", "--mean-len", "12",
                  "--max-len", "40", "--budget", "128", "--chunk", "8", "--repeats", "1")
    schema.check(r, schema.TRAIN)
    assert r["peak_mem_kind"] == "analytic_logits_bytes" and r["packed_chunked_peak_mem_gb"] is None
    # Packing sorts by length before cutting by the budget: no more padding, no more micro-batches.
    assert r["packed_padding_frac"] <= r["padded_padding_frac"]
    assert r["padded_micro_batches"] >= r["packed_micro_batches"]
    assert r["chunked_logits_gb"] < r["naive_logits_gb"]
    assert r["peak_tflops"] is None and r["packed_chunked_mfu"] is None  # CPU: no peak unless given
    assert r["compile"] is False and r["compile_s"] is None


def test_train_layouts_compares_padded_shared_and_tree_on_the_same_groups(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "train", "--layouts", "--samples", "32", "--group-size", "8", "--answers", "2",
                  "--prompt-len", "6", "--mean-len", "4", "--max-len", "8", "--repeats", "1")
    schema.check(r, schema.TRAIN_LAYOUTS)
    assert (r["groups"], r["group_size"], r["answers"]) == (4, 8, 2)
    # Two distinct completions per group of eight: the tree computes the fewest positions.
    assert r["tree_positions"] < r["shared_positions"] < r["padded_positions"]


def test_train_reports_mfu_and_weight_sync_cost(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "train", "--samples", "4", "--prompt-len", "4", "--mean-len", "8",
                  "--max-len", "16", "--budget", "128", "--chunk", "8", "--repeats", "2", "--peak-tflops", "0.5")
    schema.check(r, schema.TRAIN)
    # tiny: 804,992 parameters less the tied 128 x 128 embedding (its LM head).
    assert r["non_embedding_params"] == 804_992 - 128 * 128 and r["peak_tflops"] == 0.5
    assert None not in [r[f"{name}_mfu"] for name in schema.TRAIN_VARIANTS]  # a peak given: MFU on the CPU too
    # Full sync of the fp32 model into an fp32 generator copy (the CPU's generation dtype).
    assert r["publish_mb"] == pytest.approx(804_992 * 4 / 1e6)
    assert main(["bench", "train", "--samples", "2", "--prompt-len", "4", "--mean-len", "4", "--max-len", "8",
                 "--budget", "64", "--chunk", "8", "--repeats", "1", "--peak-tflops", "1", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "weight sync       publish: 3.2 MB, " in printed and "; adopt: " in printed and "MFU " in printed


def test_mfu_and_roofline_arithmetic_and_peak_lookup(monkeypatch):
    import torch

    from aioareal.lab.bench.roofline import Roofline, mfu, peak_bf16_tflops

    # 6 FLOPs per parameter per token: 1e9 parameters at 1,000 tokens/s is 6 TFLOPS, 0.6% of 989.
    assert mfu(10**9, 1000.0, 989.0) == pytest.approx(6e12 / 989e12)
    # A decode step of 6 sequences reads the weights once and each sequence's KV cache of 8 tokens
    # on average: (3,219,968 + 6 x 8 x 2,048) bytes per step of 6 tokens.
    roof = Roofline(param_bytes=3_219_968, kv_bytes_per_token=2048, batch=6, avg_context=8.0)
    assert roof.achieved_gbps(600.0) == pytest.approx(100 * (3_219_968 + 6 * 8 * 2048) / 1e9)
    assert roof.ceiling_tokens_per_s(100.0) == pytest.approx(6 * 100e9 / (3_219_968 + 6 * 8 * 2048))
    assert peak_bf16_tflops(torch.device("cpu")) is None
    for name, peak in (("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0),
                       ("NVIDIA A100-SXM4-80GB", 312.0), ("Tesla T4", None)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, n=name: n)
        assert peak_bf16_tflops(torch.device("cuda", 0)) == peak


def test_train_lora_against_full_fine_tuning(capsys, tmp_path):
    pytest.importorskip("peft")
    r = run_bench(capsys, tmp_path, "train", "--lora-rank", "4", "--samples", "4", "--prompt-len", "4",
                  "--mean-len", "8", "--max-len", "16", "--budget", "128", "--chunk", "8", "--repeats", "1")
    schema.check(r, schema.TRAIN_LORA)
    assert r["lora_rank"] == 4 and r["lora_alpha"] == 8.0
    # tiny: 804,992 parameters in 50 tensors; rank-4 adapters on its 28 projections: 4 layers x 4 x
    # (q 128+128, k 128+64, v 128+64, o 128+128, gate 128+384, up 128+384, down 384+128) = 38,912.
    base, n = 804_992, 38_912
    assert (r["trainable_params"], r["total_params"]) == (n, base + n)
    # Full: fp32 weights, gradients, Adam's two moments (+ a 4-byte step per tensor), an fp32
    # reference on the CPU. LoRA: the fp32 base once; gradients and moments of the adapters only.
    assert r["full_state_gb"] * 1e9 == pytest.approx(base * (4 + 4 + 8 + 4) + 50 * 4)
    assert r["lora_state_gb"] * 1e9 == pytest.approx(base * 4 + n * (4 + 4 + 8) + 56 * 4)
    # Publish: every parameter vs the 28 merged projections (4 layers x 196,608 fp32 numbers).
    assert (r["full_publish_mb"] * 1e6, r["lora_publish_mb"] * 1e6) == pytest.approx((base * 4, 4 * 196_608 * 4))


def test_train_precision_compares_autocast_and_masters_on_the_same_batches(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "train", "--precision", "--samples", "4", "--group-size", "2", "--prompt-len",
                  "4", "--mean-len", "6", "--max-len", "8", "--budget", "32", "--chunk", "8", "--repeats", "1",
                  "--fp32-matmuls")
    schema.check(r, schema.TRAIN_PRECISION)
    assert r["fp32_matmuls"] is True
    assert r["model"] == "random:tiny" and r["peak_mem_kind"] == "cpu_rss_high_water"
    # The same weights and batch: the first losses differ by bf16 rounding only.
    assert r["masters_first_loss"] == pytest.approx(r["autocast_first_loss"], abs=0.05)
    for side in ("autocast", "masters"):  # each child's own high water holds its loaded model
        assert r[f"{side}_peak_gb"] >= r[f"{side}_loaded_gb"]


def test_padded_baseline_keeps_arrival_order_within_the_token_budget():
    from aioareal.lab.bench.train import padded_groups, synthetic_samples

    samples = synthetic_samples(40, 4, 30.0, 120, 50, seed=1)
    groups = padded_groups(samples, budget=160)
    assert [s for g in groups for s in g] == samples  # every sample once, in arrival order
    for g in groups:
        width = max(len(s.prompt_ids) + len(s.completion.tokens) for s in g)
        assert len(g) == 1 or len(g) * width <= 160
    assert [len(g) for g in padded_groups(samples, 160, rows=16)] == [16, 16, 8]


def test_e2e_runs_every_mode(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "e2e", "--steps", "2", "--warmup-steps", "1", "--batch-groups", "2",
                  "--group-size", "2", "--prompt-len", "4", "--max-new-tokens", "12", "--mean-len", "6")
    modes = {"sync": 0, "one_step": 1, "async": 2}
    schema.check(r, schema.E2E, *map(schema.e2e_mode, modes))
    # Forced lengths are drawn in submission order from the seeded sampler, B x G = 4 a step, and
    # every mode trains groups in admission order: the two timed steps (after one warm-up step)
    # train draws 4 to 11 in each mode.
    from aioareal.lab.bench.parts import ForcedLengths
    from aioareal.lab.simulate.lengths import length_sampler

    forced = ForcedLengths(None, length_sampler("gsm8k", 6, 12), seed=0)
    draws = [forced.draw(forced.rng) for _ in range(12)]
    for mode, k in modes.items():
        assert r[f"{mode}_len_mean"] == pytest.approx(fmean(draws[4:]))
        assert r[f"{mode}_staleness_max"] <= k
        # Where the time went, per timed step: the trainer's forward and backward took part of it.
        assert r[f"{mode}_time_loss_s"] < r[f"{mode}_s_per_step"]
    # Sync decodes each step's own batch between its marks: every token but each sequence's first.
    assert r["sync_decode_tokens_per_step"] == (sum(draws[4:]) - len(draws[4:])) / 2
    # Sync and one-step adopt weights only between batches, so no sample spans two versions.
    assert r["sync_interrupted"] == r["one_step_interrupted"] == 0 and r["sync_staleness_max"] == 0
    # Sync generates every batch in its own step (async may have generated all ahead, in warm-up).
    assert 0 < r["sync_time_gen_decode_s"] < r["sync_s_per_step"]
    # Sync never generates and trains at once: the two busy times fit in one wall clock, so the two
    # idle fractions add up to at least 1 (async and one-step overlap them).
    assert r["sync_gen_idle"] + r["sync_train_idle"] >= 1 - 1e-9


@pytest.mark.parametrize("args, expected", [
    (["e2e", "--modes", "sync,fast"], "error: --modes sync,fast: expected a comma-separated subset of "
                                      "sync,one-step,async"),
    (["gen", "--model", "no-such-shape"], "error: --model no-such-shape: neither a shape"),
    (["gen", "--samples", "4", "--slots", "2"], "error: --slots 2 cannot hold one group of --samples 4"),
    (["gen", "--no-fuse", "--compare-fusion"], "error: --compare-fusion times the fused engine"),
    (["train", "--layouts", "--answers", "-1"], "error: --group-size must be > 0 and --answers >= 0"),
])
def test_bad_options_are_one_line_errors(capsys, args, expected):
    assert main(["bench", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected) and len(err.splitlines()) == 1


def test_head_bench_times_both_paths_and_reports_their_peaks(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "head", "--tokens", "64", "--hidden", "16", "--vocab", "256", "--chunk", "16",
                  "--repeats", "1")
    schema.check(r, schema.HEAD)
    assert (r["tokens"], r["hidden"], r["vocab"], r["chunk"]) == (64, 16, 256, 16)
    # On the CPU each path runs in its own process, whose resident-set high-water mark is read.
    assert r["peak_mem_kind"] == "cpu_rss_high_water"
    assert r["checkpoint_peak_mb"] is not None and r["fused_peak_mb"] is not None


@pytest.mark.slow
def test_profile_writes_a_profile_that_simulate_reads(capsys, tmp_path):
    """`bench profile` at a toy size (the check of its predictions against `bench e2e` is a command,
    .ci/simulate-check, not a test: it is a timing)."""
    from aioareal.lab.simulate.cost_profile import load_profile

    path = tmp_path / "profile.json"
    r = run_bench(capsys, tmp_path, "profile", "--batch-groups", "2", "--group-size", "2", "--prompt-len", "16",
                  "--max-new-tokens", "80", "--mean-len", "8", "--repeats", "1", "--write", str(path))
    schema.check(r, schema.PROFILE)
    assert r["path"] == str(path) and r["name"] == "cpu-tiny" and r["model"] == "random:tiny"
    profile = load_profile(path)
    assert profile.kind == "measured" and profile.train.unit == "positions"
    assert (profile.setup["batch_groups"], profile.setup["group_size"], profile.setup["max_new_tokens"]) == (2, 2, 80)
    assert profile.decode.points and profile.prefill.points and len(profile.train.points) == 6
    assert main(["simulate", "--profile", str(path), "--steps", "3", "--batch-groups", "2", "--group-size", "2",
                 "--mean-len", "8", "--plot", "none"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["sync_samples_s"] > 0
