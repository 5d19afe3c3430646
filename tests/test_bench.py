"""`python -m aioareal bench`: each bench runs end to end on the tiny model at toy sizes, ends with one
JSON line of its figures, and `--out` appends that line. Timings are never asserted (STYLE 9)."""
import json

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
    assert r["bench"] == "gen" and r["device"] == "cpu" and r["model"] == "random:tiny"
    assert r["engine_tokens"] == r["generate_tokens"] == 3 * 2 * 6
    assert r["engine_tok_s"] == pytest.approx(r["engine_tokens"] / r["engine_s"])
    assert r["generate_tok_s"] == pytest.approx(r["generate_tokens"] / r["generate_s"])
    assert r["ratio"] == pytest.approx(r["engine_tok_s"] / r["generate_tok_s"])
    # tiny: 4 layers x (q, k, v with biases, o, 3 MLP matrices, 2 norms) = 4 x 197,120, + tied 128 x 128
    # embedding + final norm = 804,992 fp32 parameters
    assert r["param_bytes"] == 804_992 * 4
    # Roofline: 6 sequences per decode step, each reads its average context of 5 + 6/2 tokens of KV cache.
    bytes_per_token = (r["param_bytes"] + 6 * 8 * r["kv_bytes_per_token"]) / 6
    assert r["engine_gbps"] == pytest.approx(r["engine_tok_s"] * bytes_per_token / 1e9)
    assert r["kv_bytes_per_token"] == 4 * 2 * 2 * 32 * 4  # tiny: layers * K,V * kv_heads * head_dim * fp32
    assert r["engine_roofline_frac"] is None  # no peak bandwidth known on the CPU


def test_gen_roofline_fraction_with_a_given_peak(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "1", "--samples", "2", "--prompt-len", "3",
                  "--new-tokens", "2", "--repeats", "1", "--slots", "2", "--peak-gbps", "100")
    assert r["peak_gbps"] == 100 and r["engine_roofline_frac"] == pytest.approx(r["engine_gbps"] / 100)


def test_gen_compares_fused_and_unfused_projections(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "2", "--samples", "2", "--prompt-len", "4",
                  "--new-tokens", "3", "--repeats", "1", "--compare-fusion")
    assert r["fused"] is True and len(r["unfused_s_rounds"]) == 1
    assert r["fused_vs_unfused"] == pytest.approx(r["engine_tok_s"] / r["unfused_tok_s"])
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "1", "--samples", "2", "--prompt-len", "3",
                  "--new-tokens", "2", "--repeats", "1", "--no-fuse")
    assert r["fused"] is False and "fused_vs_unfused" not in r


def test_gen_compares_shared_prefix_and_plain_decode(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "2", "--samples", "3", "--prompt-len", "5",
                  "--new-tokens", "4", "--repeats", "1", "--shared-prefix", "--compare-shared-prefix")
    assert r["shared_prefix"] is True and r["shared_on_tok_s"] == pytest.approx(r["engine_tok_s"])
    assert r["shared_vs_plain"] == pytest.approx(r["shared_on_tok_s"] / r["shared_off_tok_s"])


def test_gen_compares_overlap_on_and_off(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "2", "--samples", "2", "--prompt-len", "4",
                  "--new-tokens", "3", "--repeats", "1", "--compare-overlap")
    assert r["overlap"] is False  # auto: off on the CPU; the flipped twin overlaps
    assert r["overlap_off_tok_s"] == pytest.approx(r["engine_tok_s"])
    assert r["overlap_vs_plain"] == pytest.approx(r["overlap_on_tok_s"] / r["overlap_off_tok_s"])
    r = run_bench(capsys, tmp_path, "gen", "--prompts", "1", "--samples", "2", "--prompt-len", "3",
                  "--new-tokens", "2", "--repeats", "1", "--overlap")
    assert r["overlap"] is True and r["engine_tokens"] == 4 and "overlap_vs_plain" not in r


def test_train_reports_padding_and_memory(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "train", "--samples", "6", "--prompt-len", "4", "--mean-len", "12",
                  "--max-len", "40", "--budget", "128", "--chunk", "8", "--repeats", "1")
    assert r["bench"] == "train" and r["peak_mem_kind"] == "analytic_logits_bytes"
    assert r["chunked_vs_naive_tok_s"] == pytest.approx(r["packed_chunked_tok_s"] / r["packed_naive_tok_s"])
    assert r["packed_vs_padded_tok_s"] == pytest.approx(r["packed_chunked_tok_s"] / r["padded_chunked_tok_s"])
    assert 0 <= r["packed_padding_frac"] <= r["padded_padding_frac"] < 1
    assert r["padded_micro_batches"] >= r["packed_micro_batches"] >= 1
    assert r["chunked_logits_gb"] < r["naive_logits_gb"]
    assert r["peak_tflops"] is None and r["packed_chunked_mfu"] is None  # CPU: no peak unless given


def test_train_layouts_compares_padded_shared_and_tree_on_the_same_groups(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "train", "--layouts", "--samples", "32", "--group-size", "8", "--answers", "2",
                  "--prompt-len", "6", "--mean-len", "4", "--max-len", "8", "--repeats", "1")
    assert r["bench"] == "train_layouts" and (r["groups"], r["group_size"], r["answers"]) == (4, 8, 2)
    # Two distinct completions per group of eight: the tree computes the fewest positions.
    assert r["tree_positions"] < r["shared_positions"] < r["padded_positions"]
    assert r["tree_vs_shared"] == pytest.approx(r["shared_s"] / r["tree_s"])
    assert r["tree_vs_padded"] == pytest.approx(r["padded_s"] / r["tree_s"])


def test_train_reports_mfu_and_weight_sync_cost(capsys, tmp_path):
    r = run_bench(capsys, tmp_path, "train", "--samples", "4", "--prompt-len", "4", "--mean-len", "8",
                  "--max-len", "16", "--budget", "128", "--chunk", "8", "--repeats", "2", "--peak-tflops", "0.5")
    # tiny: 804,992 parameters less the tied 128 x 128 embedding (its LM head).
    assert r["non_embedding_params"] == 804_992 - 128 * 128 and r["peak_tflops"] == 0.5
    for name in ("packed_chunked", "packed_naive", "padded_chunked"):
        assert r[f"{name}_mfu"] == pytest.approx(6 * r["non_embedding_params"] * r[f"{name}_tok_s"] / 0.5e12)
    # Full sync of the fp32 model into an fp32 generator copy (the CPU's generation dtype).
    assert r["publish_mb"] == pytest.approx(804_992 * 4 / 1e6) and r["publish_ms"] > 0 and r["adopt_ms"] > 0
    assert main(["bench", "train", "--samples", "2", "--prompt-len", "4", "--mean-len", "4", "--max-len", "8",
                 "--budget", "64", "--chunk", "8", "--repeats", "1", "--peak-tflops", "1", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "weight sync       publish: 3.2 MB, " in printed and "; adopt: " in printed and "MFU " in printed


def test_mfu_arithmetic_and_peak_lookup(monkeypatch):
    import torch

    from aioareal.bench.roofline import mfu, peak_bf16_tflops

    # 6 FLOPs per parameter per token: 1e9 parameters at 1,000 tokens/s is 6 TFLOPS, 0.6% of 989.
    assert mfu(10**9, 1000.0, 989.0) == pytest.approx(6e12 / 989e12)
    assert peak_bf16_tflops(torch.device("cpu")) is None
    for name, peak in (("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0),
                       ("NVIDIA A100-SXM4-80GB", 312.0), ("Tesla T4", None)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, n=name: n)
        assert peak_bf16_tflops(torch.device("cuda", 0)) == peak


def test_train_lora_against_full_fine_tuning(capsys, tmp_path):
    pytest.importorskip("peft")
    r = run_bench(capsys, tmp_path, "train", "--lora-rank", "4", "--samples", "4", "--prompt-len", "4",
                  "--mean-len", "8", "--max-len", "16", "--budget", "128", "--chunk", "8", "--repeats", "1")
    assert r["variant"] == "lora_vs_full" and r["lora_rank"] == 4 and r["lora_alpha"] == 8.0
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
    assert r["lora_vs_full_tok_s"] == pytest.approx(r["lora_tok_s"] / r["full_tok_s"])


def test_padded_baseline_keeps_arrival_order_within_the_token_budget():
    from aioareal.bench.train import padded_groups, synthetic_samples

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
    assert r["bench"] == "e2e"
    for mode, k in (("sync", 0), ("one_step", 1), ("async", 2)):
        # One timed wall clock read two ways: B x G = 4 samples per step.
        assert r[f"{mode}_samples_s"] * r[f"{mode}_s_per_step"] == pytest.approx(2 * 2)
        assert r[f"{mode}_train_idle"] < 1  # the trainer was busy for both timed steps
        assert 1 <= r[f"{mode}_len_mean"] <= 12 and r[f"{mode}_staleness_max"] <= k
        # Where the time went, per timed step: the trainer's forward and backward took some of it.
        assert 0 < r[f"{mode}_time_loss_s"] < r[f"{mode}_s_per_step"]
        # Sync and one-step adopt weights only between batches, so no sample spans two versions.
        assert r[f"{mode}_interrupted"] == 0 if mode != "async" else 0 <= r[f"{mode}_interrupted"] <= 1
    # Sync generates every batch in its own step (async may have generated all ahead, in warm-up).
    assert 0 < r["sync_time_gen_decode_s"] < r["sync_s_per_step"]
    # Sync never generates and trains at once: the two busy times fit in one wall clock, so the two
    # idle fractions add up to at least 1 (async and one-step overlap them).
    assert r["sync_gen_idle"] < 1 and r["sync_gen_idle"] + r["sync_train_idle"] >= 1 - 1e-9
    assert r["async_vs_sync"] == pytest.approx(r["async_samples_s"] / r["sync_samples_s"])
    assert r["one_step_vs_sync"] == pytest.approx(r["one_step_samples_s"] / r["sync_samples_s"])


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
    assert r["bench"] == "head" and r["peak_mem_kind"] == "cpu_rss_high_water"
    assert r["checkpoint_s"] > 0 and r["fused_s"] > 0
    assert r["speedup"] == pytest.approx(r["checkpoint_s"] / r["fused_s"])
    assert r["checkpoint_peak_mb"] is not None and r["fused_peak_mb"] is not None
