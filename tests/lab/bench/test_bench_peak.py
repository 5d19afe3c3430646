"""The benches' compute side: the CPU's measured matmul peak (bench/peak.py), the FLOP model of a
phase (bench/flops.py) against hand counts, each phase's fraction of the peak in the JSON line of
`bench gen`, `bench train` and `bench e2e`, and the CPU memory high-water reader (bench/rss.py).
Timings are never asserted, only the arithmetic that ties the reported figures together."""
import json
import sys

import bench_schema as schema
import pytest
import torch

from aioareal.cli import main
from aioareal.errors import UserError
from aioareal.lab.bench import peak, rss
from aioareal.lab.bench.flops import FlopModel, phase_fields

TINY = ["--model", "tiny", "--threads", "1", "--peak-size", "64"]
# tiny: 4 layers x 197,120 (q, k, v with biases, o, gate, up, down, 2 norms) + the final norm; its
# LM head is the tied 128 x 128 embedding, counted once, as the head.
TINY_BODY, TINY_HEAD = 4 * 197_120 + 128, 128 * 128


def run_bench(capsys, *args: str) -> dict:
    assert main(["bench", *args, *TINY]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


# -- the peak ---------------------------------------------------------------------------------------

def test_cpu_flags_are_read_from_the_first_processor(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    flags = peak.cpu_flags(str(cpuinfo))
    assert flags == {"fpu", "avx512f", "amx_bf16", "amx_tile"}
    assert peak.bf16_units(flags) == "amx_bf16"
    assert peak.bf16_units({"avx512_bf16", "avx512f"}) == "avx512_bf16"
    assert peak.bf16_units({"avx512f", "avx2"}) is None and peak.bf16_units(None) is None
    assert peak.cpu_flags(str(tmp_path / "absent")) is None


def test_peak_is_measured_in_fp32_and_bf16_where_the_cpu_has_bf16_units(monkeypatch):
    monkeypatch.setattr(peak, "cpu_flags", lambda: {"avx512f", "amx_bf16"})
    probe = peak.PeakProbe.for_device(torch.device("cpu"), 64)
    probe = peak.PeakProbe(probe.size, probe.bf16_unit, stream_mb=8)
    probes = [probe(), probe(), probe()]
    assert all(set(p) == {"fp32", "bf16", "gbps"} and min(p.values()) > 0 for p in probes)
    p = probe.peaks(probes)
    assert p.gbps == sorted(q["gbps"] for q in probes)[1] and "summing reads of 8 MB" in p.note
    assert p.source == "measured_gemm" and p.fp32_probes == [q["fp32"] for q in probes]
    assert p.fp32_gflops == sorted(p.fp32_probes)[1] and p.bf16_gflops == sorted(p.bf16_probes)[1]  # medians
    assert p.of(torch.float32) == p.fp32_gflops and p.of(torch.bfloat16) == p.bf16_gflops
    assert p.of(torch.float16) is None  # no CPU peak for fp16
    assert "bf16 on amx_bf16" in p.note and f"on {torch.get_num_threads()} threads" in p.note


def test_no_bf16_peak_without_the_flags(monkeypatch):
    for flags in ({"avx512f", "avx2"}, None):  # no bf16 units; not Linux
        monkeypatch.setattr(peak, "cpu_flags", lambda f=flags: f)
        probe = peak.PeakProbe(peak.PeakProbe.for_device(torch.device("cpu"), 64).size, None, stream_mb=8)
        assert set(probe()) == {"fp32", "gbps"}
        p = probe.peaks([probe()])
        assert p.fp32_gflops > 0 and p.bf16_gflops is None
        assert "no bf16 peak" in p.note and p.fields()["peak_bf16_gflops"] is None


def test_the_peak_is_the_median_over_the_probes_of_a_run():
    p = peak.PeakProbe(64, "amx_bf16").peaks([{"fp32": 1.0, "bf16": 9.0}, {"fp32": 5.0, "bf16": 3.0},
                                                {"fp32": 2.0, "bf16": 4.0}])
    assert (p.fp32_gflops, p.bf16_gflops) == (2.0, 4.0)
    assert p.fields()["peak_fp32_gflops_probes"] == [1.0, 5.0, 2.0] and "median over 3 probes" in p.note


def test_peak_size_zero_measures_nothing_and_a_negative_one_is_an_error():
    assert peak.PeakProbe.for_device(torch.device("cpu"), 0) is None
    p = peak.fixed_peaks(torch.device("cpu"), 0)
    assert (p.fp32_gflops, p.bf16_gflops, p.source) == (None, None, "none")
    with pytest.raises(UserError, match="--peak-size must be >= 0"):
        peak.PeakProbe.for_device(torch.device("cpu"), -1)


def test_cuda_keeps_the_data_sheet_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak.PeakProbe.for_device(torch.device("cuda", 0), 2048) is None  # nothing measured on CUDA
    p = peak.fixed_peaks(torch.device("cuda", 0), 2048)
    assert (p.fp32_gflops, p.bf16_gflops, p.gbps, p.source) == (None, 989e3, 3350.0, "datasheet")


def test_bandwidth_is_the_buffer_bytes_over_the_median_read(monkeypatch):
    ticks = iter([0.0, 1.0, 10.0, 12.0, 20.0, 24.0])  # three reads: 1 s, 2 s, 4 s -> median 2 s
    monkeypatch.setattr(peak.time, "perf_counter", lambda: next(ticks))
    assert peak.stream_gbps(4, calls=3) == pytest.approx(4 * 2**20 / 2 / 1e9)


def test_gemm_flops_are_2_n_cubed_over_the_median_call(monkeypatch):
    ticks = iter([0.0, 1.0, 10.0, 12.0, 20.0, 24.0])  # three calls: 1 s, 2 s, 4 s -> median 2 s
    monkeypatch.setattr(peak.time, "perf_counter", lambda: next(ticks))
    assert peak.gemm_gflops(torch.float32, 8, calls=3) == pytest.approx(2 * 8**3 / 2 / 1e9)


# -- the FLOP model ---------------------------------------------------------------------------------

def counted_flops(fn) -> tuple[int, int]:
    """(the matmul FLOPs of the linear layers, all FLOPs) that torch's own counter saw `fn` do."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    by_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    return by_op.get("aten.mm", 0) + by_op.get("aten.addmm", 0), counter.get_total_flops()


def test_flop_model_of_the_tied_tiny_model_agrees_with_torchs_flop_counter():
    """Each phase's count against torch.utils.flop_counter on the real forward (and backward): the
    linear layers' matmuls agree within the biases and norms the model also counts (0.3% here),
    and the model stays below everything the counter saw (attention's context term is left out)."""
    from aioareal.models import random_model

    model = random_model("tiny", torch.float32, torch.device("cpu"), 0)
    fm = FlopModel.of(model)
    assert (fm.body, fm.head) == (TINY_BODY, TINY_HEAD)  # the parameters, counted by hand above
    ids = torch.randint(0, 128, (1, 10))
    phases = {  # every position's logits, as each decoded token's; logits of the last 4 rows only; a training pass
        "decode": (fm.decode(10), lambda: model(ids)),
        "prefill": (fm.prefill(10, 4), lambda: model(ids, logits_to_keep=4)),
        "train": (fm.train(10, 10), lambda: model(ids).logits.sum().backward()),
    }
    for name, (modelled, run) in phases.items():
        linear, total = counted_flops(run)
        assert linear <= modelled <= 1.01 * linear and modelled <= total, (name, modelled, linear, total)


def test_flop_model_of_an_untied_model_counts_the_head_and_not_the_embedding():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    fm = FlopModel.of(LlamaForCausalLM(config))
    # q 16x16, k and v 16x8, o 16x16, gate, up, down 16x32 each, two norms; the final norm.
    assert (fm.body, fm.head) == (256 + 2 * 128 + 256 + 3 * 512 + 2 * 16 + 16, 50 * 16)


def test_phase_fields_divide_by_the_peak_of_the_phase_dtype():
    p = peak.Peaks(100.0, 400.0, "measured_gemm", "")
    no_roof = {"x_roofline_frac": None, "x_bound": None}
    assert phase_fields("x", 8e9, 2.0, torch.bfloat16, p) == {"x_gflops": 4.0, "x_peak_frac": 0.01,
                                                             "x_roofline_frac": 0.01, "x_bound": "compute"}
    assert phase_fields("x", 8e9, 2.0, torch.float32, p) == {"x_gflops": 4.0, "x_peak_frac": 0.04,
                                                            "x_roofline_frac": 0.04, "x_bound": "compute"}
    assert phase_fields("x", 8e9, 2.0, torch.float16, p) == {"x_gflops": 4.0, "x_peak_frac": None, **no_roof}
    assert phase_fields("x", 8e9, 0.0, torch.float32, p) == {"x_gflops": None, "x_peak_frac": None, **no_roof}
    # A timed phase that counted no work (async decoded every timed batch in the warm-up) has no roofline.
    assert phase_fields("x", 0, 2.0, torch.float32, p, bytes_moved=0) == {"x_gflops": 0.0, "x_peak_frac": 0.0,
                                                                         **no_roof}


def test_the_roofline_is_the_lower_ceiling_of_compute_and_bandwidth():
    p = peak.Peaks(100.0, None, "measured_gemm", "", gbps=10.0)  # 100 GFLOP/s, 10 GB/s
    # 8 GFLOP take 0.08 s at the peak; 1 GB takes 0.1 s at the bandwidth: memory binds, 0.1 s of 2 s.
    memory = phase_fields("x", 8e9, 2.0, torch.float32, p, bytes_moved=1e9)
    assert memory["x_bound"] == "memory" and memory["x_roofline_frac"] == pytest.approx(0.05)
    compute = phase_fields("x", 8e9, 2.0, torch.float32, p, bytes_moved=1e8)  # 0.01 s of bytes
    assert compute["x_bound"] == "compute" and compute["x_roofline_frac"] == pytest.approx(0.04)
    # bf16 has no peak here: the bandwidth alone bounds it.
    only = phase_fields("x", 8e9, 2.0, torch.bfloat16, p, bytes_moved=1e9)
    assert (only["x_bound"], only["x_peak_frac"]) == ("memory", None) and only["x_roofline_frac"] == pytest.approx(0.05)


# -- the fractions in each bench's JSON line --------------------------------------------------------

def test_gen_reports_decode_and_prefill_fractions(capsys):
    r = run_bench(capsys, "gen", "--prompts", "3", "--samples", "2", "--prompt-len", "5", "--new-tokens", "6",
                  "--repeats", "1")
    assert r["peak_source"] == "measured_gemm" and r["peak_fp32_gflops"] > 0
    assert r["peak_fp32_gflops_probes"] == [r["peak_fp32_gflops"]]  # one probe in the one timed round
    # 3 x 2 sequences of 6 tokens: the first of each sampled in prefill, 5 in decode steps.
    assert (r["decode_tokens"], r["prefill_tokens"]) == (3 * 2 * 5, 3 * 5)
    assert r["decode_flops"] == 2 * (TINY_BODY + TINY_HEAD) * 30
    assert r["prefill_flops"] == 2 * TINY_BODY * 15 + 2 * TINY_HEAD * 6  # logits: one row per sample
    for phase in ("decode", "prefill"):
        assert r[f"{phase}_s"] > 0
        assert r[f"{phase}_gflops"] == pytest.approx(r[f"{phase}_flops"] / r[f"{phase}_s"] / 1e9)
        assert r[f"{phase}_peak_frac"] == pytest.approx(r[f"{phase}_gflops"] / r["peak_fp32_gflops"])


def test_train_reports_each_variant_fraction_of_the_fp32_peak(capsys):
    r = run_bench(capsys, "train", "--samples", "4", "--prompt-len", "4", "--mean-len", "8", "--max-len", "16",
                  "--budget", "128", "--chunk", "8", "--repeats", "1")
    assert r["autocast"] is None and r["compute_dtype"] == "float32"
    for name in ("packed_chunked", "packed_naive", "padded_chunked"):
        assert r[f"{name}_gflops"] == pytest.approx(r[f"{name}_flops"] / r[f"{name}_s"] / 1e9)
        assert r[f"{name}_peak_frac"] == pytest.approx(r[f"{name}_gflops"] / r["peak_fp32_gflops"])
    # One packed micro-batch: the naive baseline runs the head on every position, not only completions.
    assert r["packed_naive_flops"] > r["packed_chunked_flops"]


def test_train_in_bf16_on_the_cpu_autocasts_as_the_trainer_does(capsys, monkeypatch):
    import aioareal.lab.bench.train as train_bench

    seen = []
    real = train_bench.token_logprobs

    def spy(model, *args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                     next(model.parameters()).dtype))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(train_bench, "token_logprobs", spy)
    monkeypatch.setattr(peak, "cpu_flags", lambda: {"amx_bf16"})
    r = run_bench(capsys, "train", "--samples", "4", "--prompt-len", "4", "--mean-len", "8", "--max-len", "16",
                  "--budget", "128", "--chunk", "8", "--repeats", "1", "--dtype", "bfloat16")
    assert seen and set(seen) == {(True, torch.bfloat16, torch.float32)}  # fp32 master weights, bf16 matmuls
    assert r["autocast"] == "bfloat16" and r["compute_dtype"] == "bfloat16"
    assert r["packed_chunked_peak_frac"] == pytest.approx(r["packed_chunked_gflops"] / r["peak_bf16_gflops"])


def test_e2e_reports_decode_and_loss_fractions_per_mode(capsys):
    r = run_bench(capsys, "e2e", "--steps", "2", "--warmup-steps", "1", "--batch-groups", "2", "--group-size", "2",
                  "--prompt-len", "4", "--max-new-tokens", "12", "--mean-len", "6", "--modes", "sync,async")
    # Sync generates each step's batch in that step: every timed sample's tokens but its first
    # (sampled in prefill) come from decode steps.
    assert r["sync_decode_tokens_per_step"] == pytest.approx(4 * (r["sync_len_mean"] - 1))
    for mode in ("sync", "async"):
        # The LM head runs on the completion positions of the step's B x G = 4 samples.
        assert r[f"{mode}_loss_head_positions_per_step"] == pytest.approx(4 * r[f"{mode}_len_mean"])
        assert r[f"{mode}_loss_positions_per_step"] >= r[f"{mode}_loss_head_positions_per_step"]
        flops = (6 * TINY_BODY * r[f"{mode}_loss_positions_per_step"]
                 + 6 * TINY_HEAD * r[f"{mode}_loss_head_positions_per_step"])
        assert r[f"{mode}_loss_gflops"] == pytest.approx(flops / r[f"{mode}_time_loss_s"] / 1e9)
        assert r[f"{mode}_loss_dtype"] == "float32"
        assert r[f"{mode}_loss_peak_frac"] == pytest.approx(r[f"{mode}_loss_gflops"] / r["peak_fp32_gflops"])
    assert len(r["peak_fp32_gflops_probes"]) == 3  # before each mode and after the last
    decode = 2 * (TINY_BODY + TINY_HEAD) * r["sync_decode_tokens_per_step"]
    assert r["sync_decode_gflops"] == pytest.approx(decode / r["sync_time_gen_decode_s"] / 1e9)
    assert r["sync_decode_peak_frac"] == pytest.approx(r["sync_decode_gflops"] / r["peak_fp32_gflops"])


# -- CPU memory ------------------------------------------------------------------------------------

def test_high_water_is_read_from_vmhwm(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t    1234 kB\nVmRSS:\t  1000 kB\n")
    assert rss.high_water_bytes(str(status)) == 1234 * 1024
    status.write_text("Name:\tpython\n")
    assert rss.high_water_bytes(str(status)) is None
    assert rss.high_water_bytes(str(tmp_path / "absent")) is None
    assert rss.reset_high_water(str(tmp_path / "no" / "clear_refs")).startswith("cannot reset the RSS high-water")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self is Linux's")
def test_high_water_rises_with_an_allocation_and_falls_back_on_reset():
    assert rss.reset_high_water() is None
    base = rss.high_water_bytes()
    x = torch.ones(96 * 2**20 // 4)  # 96 MiB, every page touched
    peak_bytes = rss.high_water_bytes()
    del x  # a block this large goes back to the OS at once
    assert peak_bytes - base >= 90 * 2**20
    assert rss.reset_high_water() is None
    assert rss.high_water_bytes() < peak_bytes - 64 * 2**20  # now the resident set, without the block


def test_high_waters_keep_each_call_window_and_skip_the_warm_up(monkeypatch):
    marks = iter([5, 7, 6, 9])
    monkeypatch.setattr(rss, "reset_high_water", lambda: None)
    monkeypatch.setattr(rss, "high_water_bytes", lambda: next(marks))
    hw = rss.HighWaters()
    call = hw.wrap("a", lambda: "done")
    assert [call(), call(), call()] == ["done"] * 3
    assert hw.marks["a"] == [5, 7, 6] and hw.peak("a", skip=1) == 7 and hw.peak("a", skip=2) == 6
    monkeypatch.setattr(rss, "reset_high_water", lambda: "cannot reset (test)")
    call()
    assert hw.peak("a") is None and hw.why_not == "cannot reset (test)"


def test_train_reports_the_rss_high_water_of_each_variant(capsys, monkeypatch):
    args = ("train", "--samples", "4", "--prompt-len", "4", "--mean-len", "8", "--max-len", "16", "--budget", "128",
            "--chunk", "8", "--repeats", "1")
    r = run_bench(capsys, *args)
    assert r["rss_peak_kind"] == "cpu_rss_high_water" and "weights included" in r["rss_peak_note"]
    resident = rss.rss_bytes() / 1e9  # this process holds at least what the variants held beyond their windows
    for name in ("packed_chunked", "packed_naive", "padded_chunked"):
        assert 0.5 * resident < r[f"{name}_rss_peak_gb"] < 4 * resident
    monkeypatch.setattr(rss, "reset_high_water", lambda: "cannot reset the RSS high-water mark (test)")
    r = run_bench(capsys, *args)
    assert r["rss_peak_kind"] is None and r["rss_peak_note"] == "cannot reset the RSS high-water mark (test)"
    assert all(r[f"{name}_rss_peak_gb"] is None for name in ("packed_chunked", "packed_naive", "padded_chunked"))


def test_bench_peak_prints_the_ceilings_alone(capsys, monkeypatch):
    monkeypatch.setattr(peak, "cpu_flags", lambda: {"avx2"})
    assert main(["bench", "peak", "--device", "cpu", "--peak-size", "64", "--stream-mb", "8", "--probes", "3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    r = json.loads(out[-1])
    schema.check(r, schema.PEAK_BENCH)
    assert len(r["peak_fp32_gflops_probes"]) == len(r["peak_mem_gbps_probes"]) == 3 and r["peak_bf16_gflops"] is None
    assert r["peak_mem_gbps"] == sorted(r["peak_mem_gbps_probes"])[1]
    assert "memory" in out[0] and "GB/s" in out[0]
    assert main(["bench", "peak", "--device", "cpu", "--probes", "0"]) == 2

