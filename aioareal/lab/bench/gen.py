"""`bench gen`: the project's engine against Hugging Face `model.generate()` on the same model,
prompts and sampling settings (temperature 1, top-p 1, full-vocabulary sampling), alternating in
one process after a warm-up round.

Both produce exactly `--new-tokens` tokens per sequence: the engine through forced per-sample
`lengths` (end-of-sequence ignored), `generate()` through `min_new_tokens = max_new_tokens` (which
masks EOS until the end). The engine prefills each prompt once and shares its KV cache across the G
samples; `generate()` gets `num_return_sequences=G`, which expands the prompts before prefill.

Besides the bandwidth roofline (roofline.py), the engine's decode and prefill phases, timed by its own
phase timer, as FLOP/s and fractions of the dtype's matmul peak (engine_phases.py, flops.py, peak.py).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from ...config import Config, RunConfig
from ...config import GenerationConfig as GenerationSettings  # transformers has a GenerationConfig too
from ...errors import UserError
from ...generation import Engine
from ...generation.forward import kv_bytes_per_token
from ...group import Group
from ...run.build import build_engine, context_length
from .engine_phases import PhaseRounds, phase_figures
from .harness import (
    alternate,
    build_model,
    environment,
    max_peak,
    median_seconds,
    model_label,
    parameter_bytes,
    pick_device,
    pick_dtype,
    ratio,
)
from .peak import PROBE, PeakProbe, add_peak_argument, fraction, peak_line, peaks_of
from .roofline import Roofline, peak_gbps


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=64, help="distinct prompts (default 64)")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt, G (default 8)")
    p.add_argument("--prompt-len", type=int, default=32, help="random prompt tokens (default 32)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence (default 64)")
    p.add_argument("--slots", type=int, default=0, help="engine KV-cache slots (default prompts x samples)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round (default 3)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="capture the engine's decode steps in CUDA graphs (CUDA only; default on)")
    p.add_argument("--compile", action="store_true",
                   help="compile the engine's decode step with torch.compile (see generation.compile)")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True,
                   help="fused q/k/v and gate/up projections in the engine (default on)")
    p.add_argument("--compare-fusion", action="store_true",
                   help="also time an unfused engine on the same model in the same rounds (fused_vs_unfused)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="launch each decode step before reading the previous one's tokens (generation.overlap; "
                        "default auto: on for CUDA)")
    p.add_argument("--compare-overlap", action="store_true",
                   help="also time an engine with the other overlap setting in the same rounds (overlap_vs_plain)")
    p.add_argument("--shared-prefix", action="store_true",
                   help="decode with each group's prompt keys read once (generation.shared_prefix; eager: no CUDA "
                        "graphs)")
    p.add_argument("--compare-shared-prefix", action="store_true",
                   help="also time an engine with the other shared-prefix setting in the same rounds "
                        "(shared_vs_plain; pass --no-cuda-graphs so both decode eagerly)")
    p.add_argument("--common-prefix", type=int, default=0, metavar="N",
                   help="N random tokens every prompt starts with, before its own --prompt-len (a few-shot "
                        "context): the engine prefills them once (EngineOptions.prompt_prefix)")
    p.add_argument("--compare-common-prefix", action="store_true",
                   help="also time an engine that prefills every prompt whole, in the same rounds (prefix_vs_whole)")
    p.add_argument("--peak-gbps", type=float, default=None,
                   help="device peak memory bandwidth in GB/s (default: looked up for H100/H200/A100)")
    add_peak_argument(p)


def _check(args: argparse.Namespace) -> None:
    for name in ("prompts", "samples", "prompt_len", "new_tokens", "repeats"):
        if getattr(args, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.common_prefix < 0 or (args.compare_common_prefix and not args.common_prefix):
        raise UserError(f"--common-prefix must be >= 0, and > 0 with --compare-common-prefix; got {args.common_prefix}")
    if args.slots and args.slots < args.samples:
        raise UserError(f"--slots {args.slots} cannot hold one group of --samples {args.samples}")
    if args.compare_fusion and not args.fuse:
        raise UserError("--compare-fusion times the fused engine against an unfused one: drop --no-fuse")


def random_prompts(model: PreTrainedModel, count: int, length: int, seed: int) -> torch.Tensor:
    """(count, length) token ids drawn uniformly from the model's vocabulary, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (count, length), generator=g)


def eos_ids(model: PreTrainedModel) -> list[int]:
    eos = model.generation_config.eos_token_id if model.generation_config else None
    eos = eos if eos is not None else model.config.eos_token_id
    return list(eos) if isinstance(eos, (list, tuple)) else [eos if eos is not None else 0]


def run_engine(engine: Engine, prompts: list[list[int]], samples: int, new_tokens: int) -> int:
    """Generate every group to completion; return the number of tokens sampled."""
    for i, ids in enumerate(prompts):
        engine.submit(Group(i, ids, samples, forced_lengths=[new_tokens] * samples))
    tokens = 0
    while engine.busy:
        for group in engine.step():
            tokens += sum(len(s.tokens) for s in group.samples)
    return tokens


def generate_config(model: PreTrainedModel, samples: int, new_tokens: int) -> GenerationConfig:
    eos = eos_ids(model)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else eos[0]
    # top_k=0 disables HF's default top-50 truncation: both sides sample the full distribution.
    return GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, num_return_sequences=samples, eos_token_id=eos,
                            pad_token_id=pad, use_cache=True)


@torch.inference_mode()
def run_generate(model: PreTrainedModel, prompts: torch.Tensor, config: GenerationConfig) -> int:
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=config)
    return out[:, prompts.shape[1]:].numel()  # (prompts * G, new_tokens): every sequence ran to the end


def run(args: argparse.Namespace) -> dict[str, Any]:
    _check(args)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    model = build_model(args.model, dtype, device, args.seed).eval()
    prompts = random_prompts(model, args.prompts, args.prompt_len, args.seed)
    prefix = random_prompts(model, 1, args.common_prefix, args.seed + 1)[0] if args.common_prefix else None
    if prefix is not None:
        prompts = torch.cat([prefix.expand(args.prompts, -1), prompts], dim=1)
    sequences = args.prompts * args.samples
    slots = args.slots or sequences
    graphs = args.cuda_graphs and device.type == "cuda"
    setting = Config(generation=GenerationSettings(max_new_tokens=args.new_tokens, num_slots=slots, temperature=1.0,
                                                 top_p=1.0, cuda_graphs=args.cuda_graphs,
                                                 overlap="auto" if args.overlap is None else args.overlap,
                                                 shared_prefix=args.shared_prefix),
                     run=RunConfig(seed=args.seed))
    max_len = context_length(model, args.common_prefix + args.prompt_len, args.new_tokens, "the prompts + --new-tokens")
    shared = tuple(prefix.tolist()) if prefix is not None else ()
    # Timed, as in a run: its decode and prefill seconds per round (engine_phases.py).
    engine = build_engine(setting, model, eos_ids(model), max_len, compile=args.compile, timed=True, fuse=args.fuse,
                          prefix=shared)
    config = generate_config(model, args.samples, args.new_tokens)
    prompt_rows, prompts_dev = prompts.tolist(), prompts.to(device)
    print(f"bench gen: {model_label(args.model)} on {device} ({str(dtype).replace('torch.', '')}), "
          f"{args.prompts} prompts x {args.samples} samples, {args.common_prefix + args.prompt_len}-token prompts, "
          f"{args.new_tokens} new tokens, {slots} slots, 1 warm-up + {args.repeats} rounds", flush=True)
    phases, probe = PhaseRounds(engine), PeakProbe.for_device(device, args.peak_size)
    contenders = {"engine": phases.wrap(lambda: run_engine(engine, prompt_rows, args.samples, args.new_tokens)),
                  "generate": lambda: run_generate(model, prompts_dev, config)}
    contenders.update(twins(args, setting, engine, model, max_len, prompt_rows, shared))
    contenders.update({PROBE: probe} if probe else {})  # the CPU's peak, in the same rounds as the phases
    runs = alternate(contenders, args.repeats, device)
    peaks = peaks_of(probe, runs, device, args.peak_size)
    result = summarise(args, model, dtype, device, slots, graphs, runs, engine.cache.bytes(), peaks.gbps)
    result.update(peaks.fields())
    prompt_len = args.common_prefix + args.prompt_len  # the context decode reads, the shared part included
    roof = Roofline(parameter_bytes(model), kv_bytes_per_token(model, dtype), min(slots, args.prompts * args.samples),
                    prompt_len + args.new_tokens / 2)
    result.update(phase_figures(model, phases, args.prompts, args.samples, prompt_len, result["engine_tokens"],
                                dtype, peaks, roof))
    add_comparisons(result, args, engine, runs)
    report(result)
    return result


def add_comparisons(result: dict[str, Any], args: argparse.Namespace, engine: Engine, runs: dict) -> None:
    """What the engine did (fusion is skipped where unsafe), and each twin's figures against it."""
    result["fused"] = engine.fwd.fused
    result["overlap"] = engine.overlap
    if args.compare_overlap:
        add_overlap_comparison(result, engine.overlap, runs)
    result["shared_prefix"] = engine.shared_prefix
    if args.compare_shared_prefix:
        other = runs["prefix_flipped"][-1].result / median_seconds(runs["prefix_flipped"])
        on, off = (result["engine_tok_s"], other) if engine.shared_prefix else (other, result["engine_tok_s"])
        result["shared_on_tok_s"], result["shared_off_tok_s"], result["shared_vs_plain"] = on, off, ratio(on, off)
    result["common_prefix"] = args.common_prefix
    if args.compare_common_prefix:
        whole = runs["whole_prompts"][-1].result / median_seconds(runs["whole_prompts"])
        result["whole_prompts_tok_s"], result["prefix_vs_whole"] = whole, ratio(result["engine_tok_s"], whole)
    if args.compare_fusion:
        result["unfused_s_rounds"] = [m.seconds for m in runs["unfused"]]
        result["unfused_tok_s"] = runs["unfused"][-1].result / median_seconds(runs["unfused"])
        result["fused_vs_unfused"] = ratio(result["engine_tok_s"], result["unfused_tok_s"])


def twins(args: argparse.Namespace, setting: Config, engine: Engine, model: PreTrainedModel, max_len: int,
          prompt_rows: list[list[int]], shared: tuple[int, ...]) -> dict[str, Callable[[], Any]]:
    """Engines timed beside the main one in the same rounds: unfused, overlap flipped, shared
    prefix flipped. Each is a second engine on the same model; with fusion its build re-points the
    parameters at a fresh fused copy, while the first engine keeps computing from its own (the
    same values)."""
    out = {}

    def twin(name: str, config: Config, fuse: bool, prefix: tuple[int, ...] = shared) -> None:
        other = build_engine(config, model, eos_ids(model), max_len, compile=args.compile, timed=False, fuse=fuse,
                             prefix=prefix)
        out[name] = lambda: run_engine(other, prompt_rows, args.samples, args.new_tokens)

    g = setting.generation
    if args.compare_fusion:  # its modules read the fused storage, one matmul each
        twin("unfused", setting, False)
    if args.compare_overlap:
        twin("flipped", replace(setting, generation=replace(g, overlap=not engine.overlap)), args.fuse)
    if args.compare_shared_prefix:
        twin("prefix_flipped", replace(setting, generation=replace(g, shared_prefix=not g.shared_prefix)), args.fuse)
    if args.compare_common_prefix:
        twin("whole_prompts", setting, args.fuse, ())
    return out


def add_overlap_comparison(result: dict[str, Any], engine_overlaps: bool, runs: dict) -> None:
    """Tokens/s with overlap on and off, from the engine and its flipped twin, and their ratio."""
    flipped_tps = runs["flipped"][-1].result / median_seconds(runs["flipped"])
    on, off = (result["engine_tok_s"], flipped_tps) if engine_overlaps else (flipped_tps, result["engine_tok_s"])
    result["overlap_on_tok_s"], result["overlap_off_tok_s"] = on, off
    result["overlap_vs_plain"] = ratio(on, off)


def summarise(args: argparse.Namespace, model: PreTrainedModel, dtype: torch.dtype, device: torch.device,
              slots: int, graphs: bool, runs: dict, kv_cache_bytes: int, measured_gbps: float | None) -> dict[str, Any]:
    eng, gen = runs["engine"], runs["generate"]
    eng_s, gen_s = median_seconds(eng), median_seconds(gen)
    eng_tokens, gen_tokens = eng[-1].result, gen[-1].result
    eng_tps, gen_tps = eng_tokens / eng_s, gen_tokens / gen_s
    sequences = args.prompts * args.samples
    avg_context = args.prompt_len + args.new_tokens / 2
    roof_eng = Roofline(parameter_bytes(model), kv_bytes_per_token(model, dtype), min(slots, sequences), avg_context)
    roof_gen = Roofline(roof_eng.param_bytes, roof_eng.kv_bytes_per_token, sequences, avg_context)
    peak = args.peak_gbps or peak_gbps(device) or measured_gbps  # the CPU's: measured in the rounds (peak.py)
    return {
        "bench": "gen", **environment(device), "model": model_label(args.model),
        "dtype": str(dtype).replace("torch.", ""), "prompts": args.prompts, "samples": args.samples,
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "slots": slots, "cuda_graphs": graphs,
        "compile": args.compile,
        "repeats": args.repeats, "engine_tokens": eng_tokens, "generate_tokens": gen_tokens,
        "engine_s": eng_s, "generate_s": gen_s, "engine_s_rounds": [m.seconds for m in eng],
        "generate_s_rounds": [m.seconds for m in gen], "engine_tok_s": eng_tps, "generate_tok_s": gen_tps,
        "ratio": ratio(eng_tps, gen_tps),
        "param_bytes": roof_eng.param_bytes, "kv_bytes_per_token": roof_eng.kv_bytes_per_token,
        "engine_gbps": roof_eng.achieved_gbps(eng_tps), "generate_gbps": roof_gen.achieved_gbps(gen_tps),
        "peak_gbps": peak,
        "engine_roofline_frac": roof_eng.achieved_gbps(eng_tps) / peak if peak else None,
        "generate_roofline_frac": roof_gen.achieved_gbps(gen_tps) / peak if peak else None,
        "engine_ceiling_tok_s": roof_eng.ceiling_tokens_per_s(peak) if peak else None,
        # Memory beyond the weights: the engine's static KV cache plus its working peak; generate()'s
        # working peak (its growing cache included).
        "engine_peak_mem_gb": _gb(None if max_peak(eng) is None else max_peak(eng) + kv_cache_bytes),
        "generate_peak_mem_gb": _gb(max_peak(gen)),
    }


def _gb(n: int | None) -> float | None:
    return None if n is None else n / 1e9


def report(r: dict[str, Any]) -> None:
    for name in ("engine", "generate"):
        print(f"  {name:<9} {r[name + '_tok_s']:>10.0f} tok/s  ({r[name + '_tokens']} tokens, "
              f"median {r[name + '_s']:.3f} s of {r['repeats']})")
    print(f"  ratio     {r['ratio']:>10.2f}x engine / generate")
    if "overlap_vs_plain" in r:
        print(f"  overlap   {r['overlap_on_tok_s']:>10.0f} tok/s on, {r['overlap_off_tok_s']:.0f} off; "
              f"on / off {r['overlap_vs_plain']:.2f}x")
    if "shared_vs_plain" in r:
        print(f"  prefix    {r['shared_on_tok_s']:>10.0f} tok/s shared, {r['shared_off_tok_s']:.0f} plain; "
              f"shared / plain {r['shared_vs_plain']:.2f}x")
    if "prefix_vs_whole" in r:
        print(f"  common    {r['engine_tok_s']:>10.0f} tok/s, the {r['common_prefix']}-token prefix prefilled once, "
              f"{r['whole_prompts_tok_s']:.0f} whole; once / whole {r['prefix_vs_whole']:.2f}x")
    if "fused_vs_unfused" in r:
        print(f"  unfused   {r['unfused_tok_s']:>10.0f} tok/s; fused / unfused {r['fused_vs_unfused']:.2f}x")
    if r["engine_peak_mem_gb"] is not None:
        print(f"  memory    engine {r['engine_peak_mem_gb']:.2f} GB (KV cache + working peak), "
              f"generate {r['generate_peak_mem_gb']:.2f} GB (working peak), weights excluded")
    line = f"  bandwidth engine {r['engine_gbps']:.1f} GB/s, generate {r['generate_gbps']:.1f} GB/s"
    if r["peak_gbps"]:
        line += (f" = {100 * r['engine_roofline_frac']:.1f}% / {100 * r['generate_roofline_frac']:.1f}% of the "
                 f"{r['peak_gbps']:.0f} GB/s roofline (engine ceiling {r['engine_ceiling_tok_s']:.0f} tok/s)")
    elif r["device"].startswith("cuda"):
        line += f"; pass --peak-gbps for the roofline fraction ({r['device_name']} is not in the table)"
    print(line)
    for phase in ("decode", "prefill"):
        if r[f"{phase}_s"] is not None:
            print(f"  {phase:<9} {r[phase + '_s']:>10.3f} s/round, {r[phase + '_tokens']} tokens"
                  f"{fraction(r, phase, r['dtype'])}")
    print(f"  matmul    peak {peak_line(r)}", flush=True)
