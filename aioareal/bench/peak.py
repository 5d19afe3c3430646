"""The matmul peak a phase's FLOP/s is compared with (flops.py): on the CPU measured here, on the
threads the bench runs on; on CUDA the data-sheet figure (roofline.py).

Why measured on the CPU: a shared, virtualised CPU has no data sheet that holds. Its clock, the
cores the bench gets and whether the matrix units are used all vary, so the ceiling that means
something is what torch's own GEMM reaches here, now, on the same `torch.get_num_threads()`. The
figure is the median GFLOP/s (2 n^3 FLOPs per call) of a few square n x n GEMMs after one warm-up
call, in fp32 and, where the CPU has bf16 matrix units, in bf16. A busy machine slows the peak
and the phases alike, so the fraction is steadier than either.

bf16 is measured only where /proc/cpuinfo lists `avx512_bf16` or `amx_bf16`: without them torch
runs bf16 matmuls through fp32 conversions, a slower emulation, not a ceiling of the hardware;
there the bf16 peak is None, with the reason in `note`. fp16 has no CPU peak (no such units).

On CUDA the fp32 peak is None (the table holds tensor-core bf16 peaks only) and the bf16 peak is
the looked-up dense bf16 figure (H100/H200/A100), None for other devices.
"""
from __future__ import annotations

import argparse
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import torch

from ..errors import UserError
from .roofline import peak_bf16_tflops

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # either gives the CPU bf16 dot-product units
DEFAULT_SIZE = 2048  # fp32: about 0.2 s a call on 2 cores; bf16 (AMX) a few times less
TIMED_CALLS = 5


@dataclass(frozen=True)
class Peaks:
    fp32_gflops: float | None
    bf16_gflops: float | None
    source: str  # "measured_gemm" (CPU), "datasheet" (CUDA), "none"
    note: str  # how the figures were got, and why one is missing

    def of(self, dtype: torch.dtype) -> float | None:
        """The peak of the dtype a phase's matmuls compute in (None: no peak known for it)."""
        return {torch.float32: self.fp32_gflops, torch.bfloat16: self.bf16_gflops}.get(dtype)

    def fields(self) -> dict[str, Any]:
        return {"peak_fp32_gflops": self.fp32_gflops, "peak_bf16_gflops": self.bf16_gflops,
                "peak_source": self.source, "peak_note": self.note}


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str] | None:
    """The first processor's feature flags; None where there is no such file (not Linux)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def bf16_units(flags: set[str] | None) -> str | None:
    """The flag that says the CPU computes bf16 dot products natively (AMX first), or None."""
    return next((f for f in reversed(BF16_FLAGS) if f in (flags or set())), None)


@functools.lru_cache(maxsize=8)  # one measurement per process and setting: every bench of a test run shares it
def gemm_gflops(dtype: torch.dtype, n: int, threads: int, calls: int = TIMED_CALLS) -> float:
    """Median GFLOP/s of `calls` (n, n) x (n, n) GEMMs into a preallocated output, after one warm-up
    (which also lets oneDNN pick and JIT its kernel). `threads` keys the cache: the figure holds
    for the thread count it was measured on."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
    out = torch.empty(n, n, dtype=dtype)
    torch.mm(a, b, out=out)
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        seconds.append(time.perf_counter() - start)
    return 2 * n**3 / median(seconds) / 1e9


def measure_peaks(device: torch.device, size: int = DEFAULT_SIZE) -> Peaks:
    """The peaks for `device`: measured GEMMs of `size` on the CPU (0: none measured), the data
    sheet on CUDA."""
    if device.type == "cuda":
        tflops = peak_bf16_tflops(device)
        return Peaks(None, None if tflops is None else tflops * 1e3, "datasheet" if tflops else "none",
                     "CUDA: the looked-up dense bf16 data-sheet peak (roofline.py); no fp32 figure")
    if size < 0:
        raise UserError(f"--peak-size must be >= 0 (the n of the n x n GEMMs; 0: measure none), got {size}")
    if size == 0:
        return Peaks(None, None, "none", "--peak-size 0: no peak measured")
    threads = torch.get_num_threads()
    unit = bf16_units(cpu_flags())
    fp32 = gemm_gflops(torch.float32, size, threads)
    how = f"median of {TIMED_CALLS} {size}x{size} GEMMs on {threads} threads"
    if unit is None:
        return Peaks(fp32, None, "measured_gemm",
                     f"{how}; no bf16 peak: the CPU lists neither {' nor '.join(BF16_FLAGS)} (bf16 is emulated)")
    return Peaks(fp32, gemm_gflops(torch.bfloat16, size, threads), "measured_gemm", f"{how}; bf16 on {unit}")


def add_peak_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peak-size", type=int, default=DEFAULT_SIZE,
                   help=f"CPU: n of the n x n GEMMs that measure the matmul peak each phase is a fraction of "
                        f"(default {DEFAULT_SIZE}; 0: measure none, fractions null)")


def peak_line(r: dict[str, Any]) -> str:
    """The peaks of a bench's JSON line, for its printout."""
    shown = [f"{name} {r[f'peak_{name}_gflops']:.0f} GFLOP/s" for name in ("fp32", "bf16")
             if r[f"peak_{name}_gflops"] is not None]
    return f"{', '.join(shown) or 'none'} ({r['peak_source']}: {r['peak_note']})"


def fraction(r: dict[str, Any], name: str, dtype: str | None) -> str:
    """', 12.3 GFLOP/s = 4.5% of the bfloat16 peak' for a phase's fields, where they are known."""
    gflops, frac = r.get(f"{name}_gflops"), r.get(f"{name}_peak_frac")
    if gflops is None:
        return ""
    return f", {gflops:.1f} GFLOP/s" + (f" = {100 * frac:.1f}% of the {dtype} peak" if frac is not None else "")
