"""What every benchmark shares: device and model selection, timing, medians, peak memory, and the
one JSON line that ends each run (docs/architecture.md#performance-habits: a speed claim is a
command that measures it against its baseline in the same run).

Timing brackets a whole call with `torch.cuda.synchronize()` on CUDA (the work may be queued on any
stream, the engine's own included), so a figure is wall-clock time of finished work.
"""
from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import torch
from transformers import PreTrainedModel

from ...errors import UserError
from ...models import load_model, random_model, resolve_dtype
from ...models.named import NAMED
from ...models.shapes import RANDOM_PREFIX, SHAPES


def pick_device(name: str) -> torch.device:
    """'auto': the first GPU when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA device is available (use --device cpu or auto)")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name not in ("auto", "float32", "bfloat16", "float16"):
        raise UserError(f"--dtype {name}: expected auto, float32, bfloat16 or float16")
    return resolve_dtype(name, device)


def build_model(name: str, dtype: torch.dtype, device: torch.device, seed: int = 0) -> PreTrainedModel:
    """A named shape (random weights: throughput does not depend on them), a named offline model, or a
    local model directory or GGUF file (models/load_policy.py resolves the last three)."""
    shape = name[len(RANDOM_PREFIX):] if name.startswith(RANDOM_PREFIX) else name
    if shape in SHAPES:
        return random_model(shape, dtype, device, seed, build_on_device=True)  # drawn where they run
    if not Path(name).expanduser().exists() and name not in NAMED:
        raise UserError(f"--model {name}: neither a shape ({', '.join(SHAPES)}), a named model ({', '.join(NAMED)}) "
                        "nor a local model directory or GGUF file")
    return load_model(str(Path(name).expanduser()), dtype, device, seed=seed)


def model_label(name: str) -> str:
    shape = name[len(RANDOM_PREFIX):] if name.startswith(RANDOM_PREFIX) else name
    return f"{RANDOM_PREFIX}{shape}" if shape in SHAPES else name


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # intentional host sync: a timing boundary


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Seconds one call of `fn` takes to finish its work on `device`, and what it returned."""
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


@dataclass
class Measurement:
    seconds: float
    result: Any  # what the timed call returned (a token count, a padding fraction, ...)
    peak_bytes: int | None  # CUDA: peak bytes allocated during the call above what was allocated before it


def alternate(runs: dict[str, Callable[[], Any]], repeats: int, device: torch.device,
              warmup: int = 1) -> dict[str, list[Measurement]]:
    """Run each contender once per round, in turn (a, b, a, b, ...) so drifts in clock speed or
    memory state hit all alike; the first `warmup` rounds are discarded."""
    timings: dict[str, list[Measurement]] = {name: [] for name in runs}
    for round_ in range(warmup + repeats):
        for name, fn in runs.items():
            before = reset_peak_memory(device)
            seconds, result = timed(fn, device)
            peak = peak_memory_bytes(device)
            if round_ >= warmup:
                timings[name].append(Measurement(seconds, result, None if peak is None else peak - before))
    return timings


def median_seconds(runs: list[Measurement]) -> float:
    return median(m.seconds for m in runs)


def max_peak(runs: list[Measurement]) -> int | None:
    peaks = [m.peak_bytes for m in runs if m.peak_bytes is not None]
    return max(peaks) if peaks else None


def reset_peak_memory(device: torch.device) -> int:
    """Start a new peak-memory window; returns the bytes allocated now (0 on the CPU)."""
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak bytes allocated by torch since the last reset; None on the CPU (not cleanly measurable)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {"device": str(device), "device_name": name, "torch": torch.__version__,
            "transformers": transformers.__version__, "threads": torch.get_num_threads()}


def ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def emit(result: dict[str, Any], out: str | None) -> None:
    """Print the run's one JSON line (last line of stdout) and append it to `out` (JSONL)."""
    line = json.dumps({k: _finite(v) for k, v in result.items()})
    print(line, flush=True)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(line + "\n")


def _finite(value: Any) -> Any:
    """NaN and infinities are not JSON: write null."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value
