"""What `bench train` derives from its timings, and the lines it prints: each variant's CPU
resident-set high-water mark (rss.py), its MFU over a data-sheet peak (roofline.py) and its
achieved GFLOP/s as a fraction of the matmul peak of its compute dtype (flops.py, peak.py).

What one weight sync costs (weightsync/full.py): bytes and milliseconds per publish (trainer's master
weights -> staging on the generator's device, cast to the generation dtype) and per adoption
(staging -> the generator's parameters, in place), measured with the real `WeightSync`.

Both halves only enqueue copies on CUDA, so each is timed as harness.timed does: the device is
synchronized before and after the call, and the time is that of the finished copies (on the CPU the
copies are synchronous and perf_counter times them directly). `bench profile` times the same two
calls for `simulate`, the publish there inside a training step.
"""
from __future__ import annotations

import copy
from statistics import median
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from ...weightsync.full import WeightSync
from .flops import FlopModel, dtype_name, phase_fields
from .harness import timed
from .peak import Peaks, fraction, peak_line
from .roofline import mfu, non_embedding_params
from .rss import HighWaters

VARIANTS = {"packed_chunked": "packed + chunked", "packed_naive": "packed + naive",
            "padded_chunked": "padded + chunked"}


def add_cpu_memory(result: dict[str, Any], marks: HighWaters, device: torch.device) -> None:
    """Each variant's resident-set high-water mark on the CPU (rss.py), over its timed rounds: the
    whole process, so the fp32 weights and everything else resident are in it; None on CUDA (its
    peaks are `*_peak_mem_gb`) or where the mark cannot be reset (`rss_peak_note` says why)."""
    cpu = device.type != "cuda"
    for name in VARIANTS:
        peak = marks.peak(name, skip=1) if cpu else None  # alternate's one warm-up round
        result[f"{name}_rss_peak_gb"] = None if peak is None else peak / 1e9
    result["rss_peak_kind"] = "cpu_rss_high_water" if cpu and marks.why_not is None else None
    result["rss_peak_note"] = ("CUDA: see *_peak_mem_gb" if not cpu else marks.why_not or
                               "the process's whole resident set, weights included; VmHWM, reset before each call")


def add_peak_fractions(result: dict[str, Any], fm: FlopModel, work: dict[str, tuple[int, int]], peaks: Peaks,
                       compute: torch.dtype, moved: dict[str, int]) -> None:
    """Each variant's achieved GFLOP/s over the peak of the dtype its matmuls run in and its
    roofline fraction (flops.py); `work`: each variant's (positions computed, positions the LM head
    runs on) per pass; `moved`: the bytes a pass moves at the least."""
    result.update(peaks.fields())
    result["compute_dtype"] = dtype_name(compute)
    for name, (positions, head) in work.items():
        result[f"{name}_flops"] = fm.train(positions, head)  # one pass
        result.update(phase_fields(name, fm.train(positions, head), result[f"{name}_s"], compute, peaks, moved[name]))


def add_utilisation(result: dict[str, Any], model: PreTrainedModel, peak_tflops: float | None) -> None:
    """MFU of each variant (roofline.py), when a peak is known: looked up only for bf16/fp16 autocast,
    as the table holds tensor-core half-precision peaks."""
    params = non_embedding_params(model)
    result["non_embedding_params"], result["peak_tflops"] = params, peak_tflops
    for name in VARIANTS:
        result[f"{name}_mfu"] = mfu(params, result[f"{name}_tok_s"], peak_tflops) if peak_tflops else None


def report(r: dict[str, Any]) -> None:
    cuda = r["peak_mem_kind"] == "cuda_max_memory_allocated"
    for name, label in VARIANTS.items():
        mem = f", peak {r[name + '_peak_mem_gb']:.2f} GB beyond the weights" if cuda else ""
        util = f", MFU {100 * r[name + '_mfu']:.1f}% of {r['peak_tflops']:g} TFLOPS" if r["peak_tflops"] else ""
        print(f"  {label:<17} {r[name + '_tok_s']:>10.0f} tok/s{util}{mem}{fraction(r, name, r['compute_dtype'])}")
    print(f"  chunked / naive   {r['chunked_vs_naive_tok_s']:.2f}x tok/s; largest fp32 logits tensor "
          f"{1000 * r['chunked_logits_gb']:.1f} MB vs {1000 * r['naive_logits_gb']:.1f} MB"
          + ("" if cuda else " (analytic)"))
    print(f"  packed / padded   {r['packed_vs_padded_tok_s']:.2f}x tok/s; padding "
          f"{100 * r['packed_padding_frac']:.1f}% ({r['packed_micro_batches']} micro-batches) vs "
          f"{100 * r['padded_padding_frac']:.1f}% ({r['padded_micro_batches']})")
    if not cuda:
        marks = [r[name + "_rss_peak_gb"] for name in VARIANTS]
        shown = ", ".join(f"{m:.2f}" for m in marks) + " GB" if None not in marks else "not measured"
        print(f"  CPU memory        RSS high water {shown} ({r['rss_peak_note']})")
    print(f"  matmul peak       {peak_line(r)}")
    print(f"  weight sync       {sync_line(r)}", flush=True)
    if r.get("compile_s") is not None:
        print(f"  compile           {r['compile_s']:.1f} s: the first pass, layers compiled (not in the tok/s above)")


def sync_measure(master: nn.Module, gen_dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """Median publish and adopt times over `repeats` rounds after one warm-up, into a generator copy
    of `master` in `gen_dtype` on the same device (as a one-device run holds it)."""
    device = next(master.parameters()).device
    generator = copy.deepcopy(master).to(gen_dtype)
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None  # the engine's own, in a run
    sync = WeightSync(master, generator)
    publish, adopt = [], []
    for version in range(1, repeats + 2):
        seconds, _ = timed(lambda v=version: sync.publish(v), device)
        publish.append(seconds)
        seconds, _ = timed(lambda: sync.apply(stream), device)
        adopt.append(seconds)
    return {"publish_mb": sync.bytes_per_publish / 1e6, "publish_ms": 1e3 * median(publish[1:]),
            "adopt_ms": 1e3 * median(adopt[1:])}


def sync_line(r: dict[str, Any]) -> str:
    """The figures as one line of the bench's report."""
    return f"publish: {r['publish_mb']:.1f} MB, {r['publish_ms']:.2f} ms; adopt: {r['adopt_ms']:.2f} ms"
