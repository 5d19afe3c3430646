"""`bench train`: forward + backward tokens/s and peak memory of the trainer's two memory savers,
each against its naive baseline, on the same model and the same synthetic samples:

  (a) chunked log-probs (trainer/logprobs.py: only completion positions go through the LM head, a
      chunk at a time, recomputed in backward) vs naive (full `model(...).logits.float()`, then
      log_softmax and gather; entropy from the same full logits, as the trainer also reports it);
  (b) packed micro-batches (trainer/batching.pack: sorted by length, cut by a token budget) vs
      padded (one big batch padded to its longest row), both with chunked log-probs.

With `--lora-rank R` it compares LoRA against full fine-tuning instead (train_lora.py): tokens/s,
trainer state memory and the weight sync's bytes per publish. With `--layouts` it compares the
trainer's micro-batch layouts instead (train_layouts.py): padded, shared prompts, prefix tree.

The model keeps fp32 master weights; `--dtype bfloat16` (or float16 on CUDA) runs the forward and
backward under autocast by the trainer's own rule (trainer.autocasts), as a run with
`model.train_dtype` set to it does: on the CPU too, in bf16 (fp16 on the CPU stays fp32).

Each variant's model-FLOPs utilisation (roofline.py: 6 x non-embedding params x tokens/s over the
device's dense bf16 peak, looked up for H100/H200/A100 or given by --peak-tflops; on the CPU only
with --peak-tflops); its achieved GFLOP/s and their fraction of the matmul peak of the dtype it
computes in (flops.py, peak.py: measured on the CPU); and the full weight sync's cost: MB and ms
per publish, ms per adoption (train_figures.py `sync_measure`).

Completion lengths are long-tailed (GSM8K-like lognormal). Peak memory on CUDA is torch's peak
allocation, beyond the weights. On the CPU it is each variant's resident-set high-water mark over
its timed rounds (rss.py, reset before each call): the whole process's, so it includes the fp32
weights and all else resident; beside it, the analytic size of the largest fp32 logits tensor
each variant materialises.
"""
from __future__ import annotations

import argparse
import contextlib
import random
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel

from ...errors import UserError
from ...group import Completion, Sample
from ...trainer.batching import MicroBatch, collate, pack
from ...trainer.logprobs import KEEP_LOGITS, token_logprobs
from ...trainer.masters import compile_layers
from ...trainer.trainer import autocasts
from ..simulate.lengths import gsm8k_like_length
from .flops import FlopModel
from .harness import (
    Measurement,
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
from .peak import PROBE, PeakProbe, add_peak_argument, peaks_of
from .roofline import peak_bf16_tflops
from .rss import HighWaters
from .train_figures import VARIANTS, add_cpu_memory, add_peak_fractions, add_utilisation, report, sync_measure
from .train_layouts import run_layouts
from .train_lora import run_lora
from .train_precision import run_precision

LossFn = Callable[[PreTrainedModel, MicroBatch], torch.Tensor]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int, default=64, help="synthetic samples per pass (default 64)")
    p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per sample (default 64)")
    p.add_argument("--mean-len", type=float, default=200.0, help="mean completion length (default 200)")
    p.add_argument("--max-len", type=int, default=1024, help="completion length cap (default 1024)")
    p.add_argument("--budget", type=int, default=8192, help="packed micro-batch token budget (default 8192)")
    p.add_argument("--chunk", type=int, default=2048, help="tokens per log-prob chunk (default 2048)")
    p.add_argument("--padded-rows", type=int, default=0,
                   help="rows per padded micro-batch, in arrival order (default 0: as many as fit the token "
                        "budget once padded, as a trainer with no packing would do)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round (default 3)")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="compare LoRA of this rank against full fine-tuning instead (needs peft; default 0: off)")
    p.add_argument("--lora-alpha", type=float, default=0.0, help="LoRA alpha (default 2 x rank)")
    p.add_argument("--compile", action="store_true",
                   help="compile each decoder layer first, as train.compile does (the first pass, timed apart; "
                        "with --lora-rank both sides)")
    p.add_argument("--layouts", action="store_true",
                   help="compare the trainer's layouts (padded, shared prompts, prefix tree) instead, on groups "
                        "whose completions repeat (--group-size, --answers)")
    p.add_argument("--group-size", type=int, default=8, help="--layouts: samples per prompt (default 8)")
    p.add_argument("--answers", type=int, default=0,
                   help="--layouts: distinct completions per group, drawn with repetition (default 0: all distinct)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="device peak TFLOPS for MFU (default: dense bf16 peak looked up for H100/H200/A100 "
                        "when training in bf16 or fp16 autocast; on the CPU MFU is shown only with this)")
    p.add_argument("--precision", action="store_true",
                   help="compare train.precision=autocast against masters instead: whole training steps, each side "
                        "in its own process (peak memory, step time; --group-size samples per prompt)")
    p.add_argument("--fp32-matmuls", action="store_true",
                   help="--precision: bf16 matmuls computed in fp32 (train_precision.py), for memory figures "
                        "on a CPU without bf16 units; its times say nothing about bf16 speed")
    add_peak_argument(p)


def synthetic_samples(n: int, prompt_len: int, mean: float, cap: int, vocab: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for _ in range(n):
        length = gsm8k_like_length(rng, mean, cap)
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        completion = Completion([rng.randrange(vocab) for _ in range(length)], [0.0] * length, [0] * length)
        samples.append(Sample(prompt, completion, advantage=rng.choice((-1.0, 1.0))))
    return samples


def chunked_loss(chunk: int) -> LossFn:
    def loss(model: PreTrainedModel, mb: MicroBatch) -> torch.Tensor:
        logp, _ = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, 1.0, chunk)
        return -(logp.float() * mb.advantages[:, None] * mb.loss_mask).sum()
    return loss


def naive_loss(model: PreTrainedModel, mb: MicroBatch) -> torch.Tensor:
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                   use_cache=False).logits[:, :-1].float()  # (b, L-1, V)
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1) - logz
    with torch.no_grad():
        _entropy = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return -(logp * mb.advantages[:, None] * mb.loss_mask).sum()


def train_pass(model: PreTrainedModel, mbs: list[MicroBatch], loss_fn: LossFn, autocast: torch.dtype | None) -> int:
    """Forward + backward over every micro-batch (token-mean loss); returns real tokens processed."""
    tokens = sum(mb.completion_tokens for mb in mbs)
    device = next(model.parameters()).device.type
    ctx = torch.autocast(device, dtype=autocast) if autocast else contextlib.nullcontext()
    for mb in mbs:
        with ctx:
            loss = loss_fn(model, mb) / tokens
        loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(mb.real_tokens for mb in mbs)


def first_pass_seconds(model: PreTrainedModel, mbs: list[MicroBatch], loss_fn: LossFn,
                       autocast: torch.dtype | None, device: torch.device) -> float:
    """Compile each decoder layer (train.compile) and time the first pass, which compiles them:
    with dynamic shapes the other variants' shapes reuse that graph."""
    compile_layers(model)
    start = time.perf_counter()
    train_pass(model, mbs, loss_fn, autocast)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # intentional: the compile time includes the first pass's kernels
    return time.perf_counter() - start


def padded_groups(samples: list[Sample], budget: int, rows: int = 0) -> list[list[Sample]]:
    """The baseline's micro-batches, in arrival order: `rows` samples each, or (rows=0) as many as
    keep rows x longest row within the token budget (a lone longer sample still gets its own)."""
    if rows:
        return [samples[i:i + rows] for i in range(0, len(samples), rows)]
    groups: list[list[Sample]] = []
    width = 0
    for s in samples:
        length = len(s.prompt_ids) + len(s.completion.tokens)
        if groups and (len(groups[-1]) + 1) * max(width, length) <= budget:
            groups[-1].append(s)
            width = max(width, length)
        else:
            groups.append([s])
            width = length
    return groups


def padding_frac(mbs: list[MicroBatch]) -> float:
    return 1.0 - sum(mb.real_tokens for mb in mbs) / sum(mb.padded_tokens for mb in mbs)


def logits_bytes(mbs: list[MicroBatch], vocab: int, chunk: int | None) -> int:
    """Most fp32 logits held at once: a chunk of completion positions (all of them where they are
    few enough to keep, logprobs.KEEP_LOGITS), or the whole batch's."""
    if chunk is None:
        return max(mb.input_ids.numel() for mb in mbs) * vocab * 4
    return max((n if n * vocab <= KEEP_LOGITS else min(chunk, n)) * vocab * 4
               for n in (mb.completion_tokens for mb in mbs))


def check_args(args: argparse.Namespace) -> None:
    for name in ("samples", "prompt_len", "max_len", "budget", "chunk", "repeats"):
        if getattr(args, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.lora_rank < 0:
        raise UserError(f"--lora-rank must be >= 0, got {args.lora_rank}")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        raise UserError(f"--peak-tflops must be > 0, got {args.peak_tflops}")
    if args.group_size <= 0 or args.answers < 0:
        raise UserError(f"--group-size must be > 0 and --answers >= 0, got {args.group_size} and {args.answers}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    check_args(args)
    if args.layouts:
        return run_layouts(args)
    if args.precision:
        return run_precision(args)
    if args.lora_rank:
        return run_lora(args, chunked_loss(args.chunk), lambda vocab: synthetic_samples(
            args.samples, args.prompt_len, args.mean_len, args.max_len, vocab, args.seed))
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    # The trainer's own rule (model.train_dtype): bf16 autocast on the CPU too, fp16 on CUDA only.
    autocast = dtype if autocasts(device, dtype) else None
    model = build_model(args.model, torch.float32, device, args.seed).train()  # fp32 master weights
    vocab, pad = model.config.vocab_size, model.config.pad_token_id or 0
    samples = synthetic_samples(args.samples, args.prompt_len, args.mean_len, args.max_len, vocab, args.seed)
    batches = {"packed": pack(samples, args.budget, pad, device),
               "padded": [collate(group, pad, device) for group in padded_groups(samples, args.budget,
                                                                                 args.padded_rows)]}
    print(f"bench train: {model_label(args.model)} on {device} (fp32 master, "
          f"{'autocast ' + str(autocast).replace('torch.', '') if autocast else 'no autocast'}), "
          f"{args.samples} samples, {args.prompt_len}-token prompts, completions mean {args.mean_len:.0f} "
          f"cap {args.max_len}; {len(batches['packed'])} packed / {len(batches['padded'])} padded micro-batches",
          flush=True)
    chunked = chunked_loss(args.chunk)
    compile_s = first_pass_seconds(model, batches["packed"], chunked, autocast, device) if args.compile else None
    marks = HighWaters()
    passes = {name: (batches[name.split("_")[0]], chunked if name.endswith("chunked") else naive_loss)
              for name in VARIANTS}
    fns = {name: (lambda mbs=mbs, loss=loss: train_pass(model, mbs, loss, autocast))
           for name, (mbs, loss) in passes.items()}
    if device.type != "cuda":  # CUDA's peaks come from its allocator (alternate)
        fns = {name: marks.wrap(name, fn) for name, fn in fns.items()}
    probe = PeakProbe.for_device(device, args.peak_size)
    fns.update({PROBE: probe} if probe else {})  # the CPU's matmul peak, in the same rounds as the passes
    runs = alternate(fns, args.repeats, device)
    peaks = peaks_of(probe, runs, device, args.peak_size)
    result = summarise(args, device, autocast, compile_s, batches, runs, vocab)
    add_cpu_memory(result, marks, device)
    add_utilisation(result, model, args.peak_tflops or (peak_bf16_tflops(device) if autocast else None))
    work = {name: positions(mbs, loss) for name, (mbs, loss) in passes.items()}
    # Bytes a pass moves at the least: every micro-batch reads the weights forward and backward and
    # writes their gradients (activations, which the roofline leaves out, only add to it).
    moved = {name: 3 * parameter_bytes(model) * len(mbs) for name, (mbs, _) in passes.items()}
    add_peak_fractions(result, FlopModel.of(model), work, peaks, autocast or torch.float32, moved)
    result.update(sync_measure(model, dtype, args.repeats))  # the generator's copy in the run's dtype
    report(result)
    return result


def summarise(args: argparse.Namespace, device: torch.device, autocast: torch.dtype | None, compile_s: float | None,
              batches: dict[str, list[MicroBatch]], runs: dict[str, list[Measurement]], vocab: int) -> dict[str, Any]:
    packed, padded = batches["packed"], batches["padded"]
    result = {"bench": "train", **environment(device), "model": model_label(args.model),
              "autocast": str(autocast).replace("torch.", "") if autocast else None, "samples": args.samples,
              "prompt_len": args.prompt_len, "mean_len": args.mean_len, "max_len": args.max_len,
              "budget": args.budget, "chunk": args.chunk, "repeats": args.repeats, "compile": args.compile,
              "compile_s": compile_s,
              "packed_micro_batches": len(packed), "padded_micro_batches": len(padded),
              "packed_padding_frac": padding_frac(packed), "padded_padding_frac": padding_frac(padded)}
    for name, ms in runs.items():
        result[f"{name}_s"] = median_seconds(ms)  # one pass: forward + backward of every micro-batch
        result[f"{name}_tok_s"] = ms[-1].result / result[f"{name}_s"]
        result[f"{name}_peak_mem_gb"] = None if max_peak(ms) is None else max_peak(ms) / 1e9
    result["peak_mem_kind"] = "cuda_max_memory_allocated" if device.type == "cuda" else "analytic_logits_bytes"
    result["chunked_logits_gb"] = logits_bytes(packed, vocab, args.chunk) / 1e9
    result["naive_logits_gb"] = logits_bytes(packed, vocab, None) / 1e9
    result["chunked_vs_naive_tok_s"] = ratio(result["packed_chunked_tok_s"], result["packed_naive_tok_s"])
    result["packed_vs_padded_tok_s"] = ratio(result["packed_chunked_tok_s"], result["padded_chunked_tok_s"])
    return result


def positions(mbs: list[MicroBatch], loss: LossFn) -> tuple[int, int]:
    """(positions the forward computes, padding included; positions the LM head runs on): the
    completion positions with chunked log-probs, every position with the naive baseline's full logits."""
    computed = sum(mb.input_ids.numel() for mb in mbs)
    return computed, computed if loss is naive_loss else sum(mb.completion_tokens for mb in mbs)
