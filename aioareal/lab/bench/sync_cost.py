"""What one weight sync costs (weightsync/full.py): bytes and milliseconds per publish (trainer's master
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

from ...weightsync.full import WeightSync
from .harness import timed


def measure(master: nn.Module, gen_dtype: torch.dtype, repeats: int) -> dict[str, Any]:
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


def line(r: dict[str, Any]) -> str:
    """The figures as one line of the bench's report."""
    return f"publish: {r['publish_mb']:.1f} MB, {r['publish_ms']:.2f} ms; adopt: {r['adopt_ms']:.2f} ms"
