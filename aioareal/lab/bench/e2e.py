"""`bench e2e`: samples/s and seconds per step of `sync`, `one-step` and `async` in one run, on the
real engine, trainer, weight sync, workers and orchestrator, assembled as `run.setup` does.

Random weights never say when to stop, so each completion's length is drawn from a long-tailed
distribution (GSM8K-like lognormal by default, capped at --max-new-tokens) and forced through
`Group.forced_lengths`; that tail is what async hides and sync waits for. Rewards are random 0/1
(non-zero advantages, so the trainer does real work); there is no evaluation. Each mode gets a
fresh model with the same seed (same weights) and the first --warmup-steps steps are not timed.

Each mode's decode and loss (forward + backward) phases per timed step are also given as GFLOP/s
and fractions of the matmul peak of the dtype they compute in (flops.py, peak.py): decode from the
tokens the decode steps sampled in the timed window (all the generator sampled, less each started
sequence's first token, sampled in prefill), the loss from the positions the trainer computed for
the timed steps' batches (batching.computed_positions), in its autocast dtype, else fp32.
"""
from __future__ import annotations

import argparse
from statistics import fmean, median
from typing import Any

import torch

from ...config import DEFAULT_STALENESS
from ...errors import UserError
from ..simulate.lengths import length_sampler
from .flops import dtype_name, phase_fields
from .harness import environment, model_label, pick_device, pick_dtype, ratio
from .parts import ModeResult, run_mode
from .peak import PeakProbe, Peaks, add_peak_argument, fixed_peaks, fraction, peak_line

MODES = ("sync", "one-step", "async")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=6, help="timed training steps per mode (default 6)")
    p.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--length-dist", choices=["gsm8k", "uniform", "fixed"], default="gsm8k",
                   help="completion lengths: gsm8k (lognormal, long tail), uniform [1, 2*mean), fixed (= mean)")
    p.add_argument("--mean-len", type=float, default=200.0, help="mean completion length (default 200)")
    p.add_argument("--max-staleness", type=int, default=2, help="K of async mode (default 2)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of sync,one-step,async")
    setup_arguments(p)
    add_peak_argument(p)


def setup_arguments(p: argparse.ArgumentParser) -> None:
    """The run's shape, shared with `bench profile` (a profile records the setting it measured)."""
    p.add_argument("--batch-groups", type=int, default=8, help="prompt groups per step, B (default 8)")
    p.add_argument("--group-size", type=int, default=8, help="samples per prompt, G (default 8)")
    p.add_argument("--prompt-len", type=int, default=128, help="random prompt tokens (default 128)")
    p.add_argument("--max-new-tokens", type=int, default=768, help="completion length cap (default 768)")
    p.add_argument("--slots", type=int, default=0, help="engine slots (default B x G, as a real run)")
    p.add_argument("--micro-batch-tokens", type=int, default=8192, help="trainer token budget (default 8192)")
    p.add_argument("--compile", action="store_true",
                   help="compile the engine's decode step with torch.compile (see generation.compile)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="CUDA graphs for decode (CUDA only; default on)")


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UserError(f"--modes {text}: expected a comma-separated subset of {','.join(MODES)}")
    return modes


def _check(args: argparse.Namespace) -> None:
    for name in ("steps", "batch_groups", "prompt_len", "max_new_tokens", "micro_batch_tokens"):
        if getattr(args, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.group_size < 2:
        raise UserError(f"--group-size must be >= 2 for group advantages, got {args.group_size}")
    if args.warmup_steps < 0 or args.max_staleness < 0 or args.mean_len <= 0:
        raise UserError("--warmup-steps and --max-staleness must be >= 0 and --mean-len > 0")
    if args.slots and args.slots < args.group_size:
        raise UserError(f"--slots {args.slots} cannot hold one group of --group-size {args.group_size}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    _check(args)
    modes = _modes(args.modes)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    lengths = length_sampler(args.length_dist, args.mean_len, args.max_new_tokens)
    print(f"bench e2e: {model_label(args.model)} on {device} ({str(dtype).replace('torch.', '')}), "
          f"B={args.batch_groups} x G={args.group_size}, {args.prompt_len}-token prompts, {args.length_dist} "
          f"lengths mean {args.mean_len:.0f} cap {args.max_new_tokens}, {args.warmup_steps} warm-up + "
          f"{args.steps} timed steps per mode", flush=True)
    probe = PeakProbe.for_device(device, args.peak_size)
    probes: list[dict[str, float]] = []  # the CPU's peak before each mode and after the last: the spells they saw
    results: dict[str, ModeResult] = {}
    for mode in modes:
        probes += [probe()] if probe else []
        k = args.max_staleness if mode == "async" else DEFAULT_STALENESS[mode]
        results[mode] = run_mode(args, mode, k, device, dtype, lengths)
        report_mode(mode, k, results[mode])
    probes += [probe()] if probe else []
    peaks = probe.peaks(probes) if probe else fixed_peaks(device, args.peak_size)
    out: dict[str, Any] = {
        "bench": "e2e", **environment(device), "model": model_label(args.model),
        "dtype": str(dtype).replace("torch.", ""), "batch_groups": args.batch_groups, "group_size": args.group_size,
        "slots": args.slots or args.batch_groups * args.group_size, "prompt_len": args.prompt_len,
        "max_new_tokens": args.max_new_tokens, "length_dist": args.length_dist,
        "mean_len": args.mean_len, "max_staleness": args.max_staleness, "steps": args.steps,
        "warmup_steps": args.warmup_steps, "seed": args.seed, "micro_batch_tokens": args.micro_batch_tokens,
        **peaks.fields()}
    print(f"  matmul    peak {peak_line(out)}")
    for mode, r in results.items():
        key = mode.replace("-", "_")
        out.update({**mode_fields(key, r), **work_fields(key, r, dtype, peaks)})
        report_work(mode, r, {name.removeprefix(key + "_"): v for name, v in out.items()})
    for mode in ("async", "one-step"):
        if mode in results and "sync" in results:
            key = mode.replace("-", "_")
            out[f"{key}_vs_sync"] = ratio(results[mode].samples_per_s, results["sync"].samples_per_s)
            print(f"  {mode}/sync  {out[f'{key}_vs_sync']:.2f}x samples/s")
    return out


def mode_fields(key: str, r: ModeResult) -> dict[str, Any]:
    return {f"{key}_samples_s": r.samples_per_s, f"{key}_s_per_step": r.s_per_step,
            f"{key}_s_per_step_median": median(r.step_seconds), f"{key}_gen_idle": r.gen_idle,
            f"{key}_train_idle": r.train_idle, f"{key}_len_mean": fmean(r.lengths),
            f"{key}_staleness_max": r.staleness_max, f"{key}_interrupted": r.interrupted,
            **{f"{key}_time_{phase}_s": seconds for phase, seconds in sorted(r.phases.items())}}


def work_fields(key: str, r: ModeResult, dtype: torch.dtype, peaks: Peaks) -> dict[str, Any]:
    """A mode's decode and loss (forward + backward) phases per timed step: the work counted
    (flops.py), its GFLOP/s over the phase's seconds, and the fraction of the peak of the dtype it
    computes in (the generator's weights; the trainer's autocast dtype, else fp32)."""
    positions, head = r.loss_positions
    out = {f"{key}_decode_tokens_per_step": r.decode_tokens, f"{key}_loss_positions_per_step": positions,
           f"{key}_loss_head_positions_per_step": head, f"{key}_loss_dtype": dtype_name(r.loss_dtype)}
    out.update(phase_fields(f"{key}_decode", r.flops.decode(r.decode_tokens), r.phases.get("gen_decode"), dtype,
                            peaks))
    out.update(phase_fields(f"{key}_loss", r.flops.train(positions, head), r.phases.get("loss"), r.loss_dtype, peaks))
    return out


def report_mode(mode: str, k: int, r: ModeResult) -> None:
    print(f"  {mode:<9} K={k}  {r.samples_per_s:8.1f} samples/s  {r.s_per_step:7.3f} s/step  "
          f"gen idle {100 * r.gen_idle:4.1f}%  train idle {100 * r.train_idle:4.1f}%  "
          f"len mean {fmean(r.lengths):.0f}  staleness max {r.staleness_max}  "
          f"interrupted {100 * r.interrupted:.0f}%", flush=True)
    busiest = sorted(r.phases.items(), key=lambda kv: -kv[1])[:6]
    print("             s/step in " + ", ".join(f"{phase} {seconds:.3f}" for phase, seconds in busiest), flush=True)


def report_work(mode: str, r: ModeResult, fields: dict[str, Any]) -> None:
    """`fields`: the mode's JSON fields with its prefix taken off (decode_gflops, loss_peak_frac, ...)."""
    print(f"  {mode:<9} decode {r.decode_tokens:.0f} tokens/step{fraction(fields, 'decode', fields['dtype'])}; "
          f"loss {r.loss_positions[0]:.0f} positions/step{fraction(fields, 'loss', fields['loss_dtype'])}",
          flush=True)
