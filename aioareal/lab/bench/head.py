"""`bench head`: forward + backward of the trainer's selected-token log-probs from hidden states,
the fused LM head + log-softmax (trainer/logprobs.py) against activation checkpointing per
chunk (the path it replaced, still taken by wrapped heads), on random (tokens, hidden) states and
a random (vocab, hidden) head: seconds per call and peak memory.

Peak memory on CUDA is torch's peak allocation above what was allocated before the call. On the
CPU torch's allocations are not counted, so each path runs in its own child process and the peak
is its resident set's high-water mark (ru_maxrss, rss.py) above its resident set just before the first
call: the inputs and the weight are not in it, everything the path allocates is.
"""
from __future__ import annotations

import argparse
import multiprocessing
from statistics import median
from typing import Any

import torch

from .harness import alternate, environment, max_peak, median_seconds, pick_device, pick_dtype, ratio
from .rss import lifetime_high_water_bytes, rss_bytes

PATHS = ("checkpoint", "fused")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", type=int, default=2048, help="completion tokens in the micro-batch")
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=512, help="tokens per chunk (train.logprob_chunk)")
    p.add_argument("--repeats", type=int, default=3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)  # the autocast dtype, as the trainer's (weights stay fp32)
    shape = (args.tokens, args.hidden, args.vocab, args.chunk)
    if device.type == "cuda":
        figures = _on_cuda(shape, dtype, device, args.repeats, args.seed)
    else:  # one child per path: ru_maxrss only ever grows
        with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
            figures = {path: pool.apply(_on_cpu, (path, shape, dtype, args.repeats, args.seed, args.threads))
                       for path in PATHS}
    (cs, cm), (fs, fm) = figures["checkpoint"], figures["fused"]
    return {"bench": "head", **environment(device), "tokens": args.tokens, "hidden": args.hidden,
            "vocab": args.vocab, "chunk": args.chunk, "dtype": str(dtype).removeprefix("torch."),
            "checkpoint_s": cs, "fused_s": fs, "speedup": ratio(cs, fs),
            "checkpoint_peak_mb": _mb(cm), "fused_peak_mb": _mb(fm), "memory_ratio": ratio(cm or 0, fm or 0),
            "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda" else "cpu_rss_high_water"}


def _setup(shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device, seed: int):
    from ...trainer import logprobs

    n, hidden, vocab, chunk = shape
    gen = torch.Generator(device).manual_seed(seed)
    h = torch.randn(n, hidden, generator=gen, device=device).requires_grad_()
    head = torch.nn.Linear(hidden, vocab, bias=False, device=device)
    targets = torch.randint(0, vocab, (n,), generator=gen, device=device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step(path: str) -> None:
        applies = logprobs.fused_head_applies
        logprobs.fused_head_applies = (lambda m: path == "fused" and applies(m))  # type: ignore[assignment]
        try:
            with autocast:
                logp, _ = logprobs.selected_logprobs(h, targets, head, 1.0, chunk)
                logp.sum().backward()
        finally:
            logprobs.fused_head_applies = applies
        h.grad = head.weight.grad = None
    return step


def _on_cuda(shape, dtype, device, repeats: int, seed: int) -> dict[str, tuple[float, int | None]]:
    step = _setup(shape, dtype, device, seed)
    runs = alternate({path: (lambda p=path: step(p)) for path in PATHS}, repeats, device)
    return {path: (median_seconds(m), max_peak(m)) for path, m in runs.items()}


def _on_cpu(path: str, shape, dtype, repeats: int, seed: int, threads: int) -> tuple[float, int]:
    import time

    if threads > 0:
        torch.set_num_threads(threads)
    step = _setup(shape, dtype, torch.device("cpu"), seed)
    before = rss_bytes()
    seconds = []
    for _ in range(repeats + 1):  # the first call warms up
        start = time.perf_counter()
        step(path)
        seconds.append(time.perf_counter() - start)
    peak = lifetime_high_water_bytes() - before
    return median(seconds[1:]), peak


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)
