"""`bench train --precision`: the trainer's two ways of computing in bf16 (train.precision), each a
whole training step (`train_step`: packing, forward and backward of every micro-batch, the AdamW
update, and with `masters` the copy back), on the same synthetic groups:

  autocast  the fp32 model under bf16 autocast: each linear casts its input and weight per call,
            the residual stream and element-wise ops stay fp32;
  masters   a bf16 working copy runs forward and backward, the optimizer updates fp32 masters
            kept apart (trainer/masters.py).

Groups are --samples / --group-size prompts of --prompt-len tokens, each with --group-size
completions of GSM8K-like lengths (the prompt shared, as in a run), rewards alternating 0/1.

Memory: each side runs in its own child process, so its peak is its own. On the CPU the peak is the
child's resident-set high-water mark (ru_maxrss, rss.py) over the whole child: the fp32 masters,
their gradients and AdamW's moments, the working copy, activations and the runtime, as a run's
`/usr/bin/time -v` counts them (without the generator's copy); the resident set after a step and
`malloc_trim` is what stays between steps. On CUDA, torch's peak allocation. Time: the median step
after one warm-up step; on a CPU without bf16 matmul units (AVX2 only) bf16 is emulated and the
times say nothing about a CPU with them; `--fp32-matmuls` (`Fp32Matmuls`, below) measures the memory
of bf16 steps there at fp32 speed.

`Fp32Matmuls` (`--fp32-matmuls`): bf16 matmuls computed in fp32, for memory measurements on a CPU without bf16
matmul units.

On an AVX2-only CPU torch's bf16 matmul has no fast kernel: it runs some 50x slower than fp32
(measured 2026-11-26: 0.3 against 16.6 GFLOP/s for 2,048 x 576 @ 576 x 1,536 on 2 loaded cores), so a
bf16 training step of a 135M-parameter model takes hours. Memory does not depend on how a matmul
is computed but on which tensors exist: under this mode every bf16 `mm`, `addmm`, `bmm` and
`baddbmm` upcasts its operands, multiplies in fp32 and returns the bf16 result it would have
returned, so every tensor the step keeps has its bf16 dtype and shape, and the step runs at fp32
speed. What it adds: each such call's fp32 operand copies and output, freed when it returns (the
largest, the 49k-word head's weight, 0.11 GB for SmolLM2-135M), the same on both sides of a
comparison. Results differ from a true bf16 matmul by its rounding (fp32 accumulation either way).
Timings under it say nothing about bf16 speed.
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import random
import time
from statistics import median
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...config import load_config
from ...devices import release_freed_memory
from ...errors import UserError
from ...group import Completion, Group, Sample
from ...trainer.batching import collate
from ..simulate.lengths import gsm8k_like_length
from .harness import build_model, environment, model_label, pick_device, pick_dtype, ratio
from .rss import lifetime_high_water_bytes, rss_bytes

SIDES = ("autocast", "masters")


def groups(args: argparse.Namespace, vocab: int, seed: int) -> list[Group]:
    rng = random.Random(seed)
    out = []
    for gid in range(max(1, args.samples // args.group_size)):
        prompt = [rng.randrange(vocab) for _ in range(args.prompt_len)]
        group = Group(gid, prompt, args.group_size)
        for i in range(args.group_size):
            n = gsm8k_like_length(rng, args.mean_len, args.max_len)
            tokens = [rng.randrange(vocab) for _ in range(n)]
            group.samples.append(Sample(prompt, Completion(tokens, [-2.0] * n, [0] * n, "stop"), float(i % 2)))
        out.append(group)
    return out


def run_precision(args: argparse.Namespace) -> dict[str, Any]:
    device = pick_device(args.device)
    dtype = torch.bfloat16 if args.dtype == "auto" else pick_dtype(args.dtype, device)
    if dtype != torch.bfloat16:
        raise UserError(f"--precision compares bf16 training; --dtype resolves to {dtype}, use --dtype bfloat16")
    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        sides = {side: pool.apply(_side, (side, args)) for side in SIDES}
    result = {"bench": "train", "variant": "precision", **environment(device), "model": model_label(args.model),
              "samples": args.samples, "group_size": args.group_size, "prompt_len": args.prompt_len,
              "mean_len": args.mean_len, "max_len": args.max_len, "budget": args.budget, "chunk": args.chunk,
              "repeats": args.repeats, "fp32_matmuls": args.fp32_matmuls,
              "peak_mem_kind": "cuda_max_memory_allocated" if device.type == "cuda" else "cpu_rss_high_water"}
    for side, figures in sides.items():
        result.update({f"{side}_{k}": v for k, v in figures.items()})
    result["masters_vs_autocast_peak"] = ratio(result["masters_peak_gb"], result["autocast_peak_gb"])
    result["masters_vs_autocast_step_s"] = ratio(result["masters_step_s"], result["autocast_step_s"])
    report(result)
    return result


def _side(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side in a fresh process: build, one warm-up step, `repeats` timed steps."""
    from ...trainer import Trainer, train_step

    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    model = build_model(args.model, torch.float32, device, args.seed)
    config = load_config(overrides=[f"train.precision={side}", f"train.micro_batch_tokens={args.budget}",
                                    f"train.logprob_chunk={args.chunk}", f"algo.group_size={args.group_size}"])
    trainer = Trainer(model, config.algo, config.train, pad_id=model.config.pad_token_id or 0,
                      autocast_dtype=torch.bfloat16, loss_constant=args.max_len)
    loaded = rss_bytes()
    seconds, losses = [], []
    for step in range(args.repeats + 1):
        batch = groups(args, model.config.vocab_size, args.seed + step)
        start = time.perf_counter()
        with Fp32Matmuls() if args.fp32_matmuls else contextlib.nullcontext():
            losses.append(train_step(trainer, batch)["loss"])  # its one host sync waits for the device
        seconds.append(time.perf_counter() - start)
        release_freed_memory(device)  # as the run does after each step
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda" else lifetime_high_water_bytes())
    with Fp32Matmuls() if args.fp32_matmuls else contextlib.nullcontext():
        one, two = (saved_bytes(trainer, args, rows) for rows in (1, 2))
    positions = args.prompt_len + int(args.mean_len)
    return {"step_s": median(seconds[1:]), "peak_gb": peak / 1e9, "loaded_gb": loaded / 1e9,
            "after_step_gb": rss_bytes() / 1e9, "first_loss": losses[0],
            "saved_mb_per_position": (two - one) / positions / 1e6, "saved_fixed_mb": (2 * one - two) / 1e6}


def saved_bytes(trainer: Any, args: argparse.Namespace, rows: int) -> int:
    """Bytes the autograd graph keeps for the backward of the trainer's log-probs on `rows` padded rows
    of --prompt-len + --mean-len tokens: distinct storages, the parameters' own excluded (autocast's
    cached bf16 casts of them included). Two row counts give a per-position slope and a fixed part."""
    models = [trainer.model] + ([trainer.working.model] if trainer.working is not None else [])
    params = {p.untyped_storage().data_ptr() for m in models for p in m.parameters()}
    vocab, n = trainer.model.config.vocab_size, int(args.mean_len)
    rng = random.Random(args.seed)
    prompt = [rng.randrange(vocab) for _ in range(args.prompt_len)]
    samples = [Sample(prompt, Completion([rng.randrange(vocab) for _ in range(n)], [-2.0] * n, [0] * n))
               for _ in range(rows)]
    mb = collate(samples, trainer.pad_id, trainer.device)  # the padded layout: every position computed
    seen: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        logp, _ = trainer._logprobs(trainer.model, mb)
    del logp
    return sum(seen.values())


def report(r: dict[str, Any]) -> None:
    kind = "RSS high water" if r["peak_mem_kind"] == "cpu_rss_high_water" else "peak allocated"
    for side in SIDES:
        print(f"  {side:<9} step {r[side + '_step_s']:.2f} s; {kind} {r[side + '_peak_gb']:.2f} GB "
              f"(after loading {r[side + '_loaded_gb']:.2f}, between steps {r[side + '_after_step_gb']:.2f}); "
              f"first loss {r[side + '_first_loss']:.4f}; saved for the backward "
              f"{r[side + '_saved_mb_per_position']:.3f} MB per position + {r[side + '_saved_fixed_mb']:.0f} MB")
    print(f"  masters / autocast  {r['masters_vs_autocast_peak']:.2f}x peak memory, "
          f"{r['masters_vs_autocast_step_s']:.2f}x step time", flush=True)


aten = torch.ops.aten
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}


def _up(x: Any) -> Any:
    return x.float() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else x


class Fp32Matmuls(TorchDispatchMode):
    """Inside `with Fp32Matmuls():`, bf16 matmuls run in fp32 and return bf16 (autograd's backward
    matmuls included: the mode is active while `backward()` is called from inside it)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func in MATMULS and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            return func(*map(_up, args), **{k: _up(v) for k, v in kwargs.items()}).to(torch.bfloat16)
        return func(*args, **kwargs)
