"""The matmul peak a phase's FLOP/s is compared with (flops.py): on the CPU measured here, on the
threads the bench runs on, in the same run as the phases; on CUDA the data-sheet figure (roofline.py).

Why measured on the CPU: a shared, virtualised CPU has no data sheet that holds. Its clock, the
cores the bench gets and whether the matrix units are used all vary, so the ceiling that means
something is what torch's own GEMM reaches here, on the same `torch.get_num_threads()`. One probe
is, per dtype, a warm-up n x n GEMM and then a few timed ones, their median GFLOP/s (2 n^3 FLOPs a
call), in fp32 and, where the CPU has bf16 matrix units, in bf16.

Why in every round: on a machine shared with other work the GEMM's speed swings by 2-3x within a
minute, so one probe before the phases can catch a busy spell the phases missed (a training pass
then read 178% of "the peak"). `bench gen` and `bench train` run the probe as one more contender
of their alternating rounds (harness.alternate), `bench e2e` before each mode and after the last;
the peak is the median over those probes, so the phases and their peak see the same spells.

bf16 is measured only where /proc/cpuinfo lists `avx512_bf16` or `amx_bf16`: without them torch
runs bf16 matmuls through fp32 conversions, a slower emulation, not a ceiling of the hardware;
there the bf16 peak is None, with the reason in `note`. fp16 has no CPU peak (no such units).

On CUDA the fp32 peak is None (the table holds tensor-core bf16 peaks only) and the bf16 peak is
the looked-up dense bf16 figure (H100/H200/A100), None for other devices.

Beside the matmul peak each probe measures the memory bandwidth the same threads reach: a summing
read of a buffer far larger than the caches (STREAM_MB), bytes over the median call. With both
ceilings a phase's roofline is the lower of the two for its FLOPs and bytes (flops.py). On CUDA the
bandwidth is the data sheet's (roofline.py).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import torch

from ...devices import BF16_FLAGS, bf16_units, cpu_flags
from ...errors import UserError
from .roofline import peak_bf16_tflops, peak_gbps

DEFAULT_SIZE = 2048  # fp32: 0.05-0.2 s a call on 2 shared cores; bf16 (AMX) several times less
TIMED_CALLS = 3  # per probe, after one warm-up call; a run holds several probes
STREAM_MB = 512  # the bandwidth probe's buffer: far beyond any CPU's last-level cache
PROBE = "peak"  # the probe's name among a bench's contenders


@dataclass(frozen=True)
class Peaks:
    fp32_gflops: float | None
    bf16_gflops: float | None
    source: str  # "measured_gemm" (CPU), "datasheet" (CUDA), "none"
    note: str  # how the figures were got, and why one is missing
    fp32_probes: list[float] = field(default_factory=list)  # each probe's figure, for judging the noise
    bf16_probes: list[float] = field(default_factory=list)
    gbps: float | None = None  # memory bandwidth: measured on the CPU, the data sheet's on CUDA
    gbps_probes: list[float] = field(default_factory=list)

    def of(self, dtype: torch.dtype) -> float | None:
        """The peak of the dtype a phase's matmuls compute in (None: no peak known for it)."""
        return {torch.float32: self.fp32_gflops, torch.bfloat16: self.bf16_gflops}.get(dtype)

    def fields(self) -> dict[str, Any]:
        return {"peak_fp32_gflops": self.fp32_gflops, "peak_bf16_gflops": self.bf16_gflops,
                "peak_source": self.source, "peak_note": self.note,
                "peak_fp32_gflops_probes": self.fp32_probes, "peak_bf16_gflops_probes": self.bf16_probes,
                "peak_mem_gbps": self.gbps, "peak_mem_gbps_probes": self.gbps_probes}


def gemm_gflops(dtype: torch.dtype, n: int, calls: int = TIMED_CALLS) -> float:
    """Median GFLOP/s of `calls` (n, n) x (n, n) GEMMs into a preallocated output, after one
    warm-up call (which also lets oneDNN pick and JIT its kernel)."""
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


def stream_gbps(megabytes: int = STREAM_MB, calls: int = TIMED_CALLS) -> float:
    """GB/s of the median of `calls` summing reads of an fp32 buffer of `megabytes` (one add per
    4 bytes read: memory-bound on any CPU), after one warm-up read that also faults the pages in."""
    buffer = torch.ones(megabytes * 2**20 // 4)
    buffer.sum()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        buffer.sum()
        seconds.append(time.perf_counter() - start)
    return buffer.numel() * 4 / median(seconds) / 1e9


@dataclass(frozen=True)
class PeakProbe:
    """One call measures the CPU's peaks now: {"fp32": GFLOP/s, "bf16": GFLOP/s where it has
    bf16 units}; `peaks` takes the median over several calls."""

    size: int
    bf16_unit: str | None  # the cpuinfo flag of the bf16 units, None without them
    stream_mb: int = STREAM_MB  # the bandwidth probe's buffer

    @classmethod
    def for_device(cls, device: torch.device, size: int) -> PeakProbe | None:
        """A probe of GEMMs of `size` on the CPU; None on CUDA (data sheet) or with size 0."""
        if size < 0:
            raise UserError(f"--peak-size must be >= 0 (the n of the n x n GEMMs; 0: measure none), got {size}")
        return cls(size, bf16_units(cpu_flags())) if device.type != "cuda" and size > 0 else None

    def __call__(self) -> dict[str, float]:
        out = {"fp32": gemm_gflops(torch.float32, self.size), "gbps": stream_gbps(self.stream_mb)}
        if self.bf16_unit is not None:
            out["bf16"] = gemm_gflops(torch.bfloat16, self.size)
        return out

    def peaks(self, probes: list[dict[str, float]]) -> Peaks:
        how = (f"median over {len(probes)} probes in the run of the median of {TIMED_CALLS} {self.size}x{self.size} "
               f"GEMMs on {torch.get_num_threads()} threads")
        fp32, bf16, gbps = ([p[k] for p in probes if k in p] for k in ("fp32", "bf16", "gbps"))
        how += f"; bandwidth: summing reads of {self.stream_mb} MB"
        if self.bf16_unit is None:
            why = f"no bf16 peak: the CPU lists neither {' nor '.join(BF16_FLAGS)} (bf16 is emulated)"
            return Peaks(_median(fp32), None, "measured_gemm", f"{how}; {why}", fp32, [], _median(gbps), gbps)
        return Peaks(_median(fp32), _median(bf16), "measured_gemm", f"{how}; bf16 on {self.bf16_unit}", fp32, bf16,
                     _median(gbps), gbps)


def _median(values: list[float]) -> float | None:
    return median(values) if values else None


def fixed_peaks(device: torch.device, size: int) -> Peaks:
    """The peaks where no probe runs: the data sheet's on CUDA, none with --peak-size 0."""
    if device.type == "cuda":
        tflops = peak_bf16_tflops(device)
        return Peaks(None, None if tflops is None else tflops * 1e3, "datasheet" if tflops else "none",
                     "CUDA: the looked-up dense bf16 and bandwidth data-sheet peaks (roofline.py); no fp32 figure",
                     gbps=peak_gbps(device))
    return Peaks(None, None, "none", f"--peak-size {size}: no peak measured")


def peaks_of(probe: PeakProbe | None, runs: dict[str, list[Any]], device: torch.device, size: int) -> Peaks:
    """The peaks of a run whose alternating rounds held `probe` as the contender PROBE (its
    measurements are taken out of `runs`), or the fixed ones where there was no probe."""
    if probe is None:
        return fixed_peaks(device, size)
    return probe.peaks([m.result for m in runs.pop(PROBE)])


def add_peak_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peak-size", type=int, default=DEFAULT_SIZE,
                   help=f"CPU: n of the n x n GEMMs that measure the matmul peak each phase is a fraction of "
                        f"(default {DEFAULT_SIZE}; 0: measure none, fractions null)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`bench peak`: the ceilings alone, as every other bench measures them beside its phases."""
    add_peak_argument(p)
    p.add_argument("--stream-mb", type=int, default=STREAM_MB,
                   help=f"MB of the buffer whose summing read measures the memory bandwidth (default {STREAM_MB})")
    p.add_argument("--probes", type=int, default=3, help="probes; the figures are their medians (default 3)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The device's matmul peaks and memory bandwidth: measured on the CPU (the median of `--probes`
    probes), the data sheet's on CUDA."""
    from .harness import environment, pick_device

    device = pick_device(args.device)
    if args.stream_mb <= 0 or args.probes <= 0:
        raise UserError(f"--stream-mb and --probes must be > 0, got {args.stream_mb} and {args.probes}")
    probe = PeakProbe.for_device(device, args.peak_size)
    if probe is None:
        peaks = fixed_peaks(device, args.peak_size)
    else:
        probe = PeakProbe(probe.size, probe.bf16_unit, args.stream_mb)
        peaks = probe.peaks([probe() for _ in range(args.probes)])
    result = {"bench": "peak", **environment(device), **peaks.fields()}
    print(f"bench peak: {peak_line(result)}", flush=True)
    return result


def peak_line(r: dict[str, Any]) -> str:
    """The peaks of a bench's JSON line, for its printout."""
    shown = [f"{name} {r[f'peak_{name}_gflops']:.0f} GFLOP/s" for name in ("fp32", "bf16")
             if r[f"peak_{name}_gflops"] is not None]
    shown += [f"memory {r['peak_mem_gbps']:.1f} GB/s"] if r.get("peak_mem_gbps") else []
    return f"{', '.join(shown) or 'none'} ({r['peak_source']}: {r['peak_note']})"


def fraction(r: dict[str, Any], name: str, dtype: str | None) -> str:
    """', 12.3 GFLOP/s = 4.5% of the bfloat16 peak' for a phase's fields, where they are known."""
    gflops, frac = r.get(f"{name}_gflops"), r.get(f"{name}_peak_frac")
    if gflops is None:
        return ""
    roof, bound = r.get(f"{name}_roofline_frac"), r.get(f"{name}_bound")
    return (f", {gflops:.1f} GFLOP/s" + (f" = {100 * frac:.1f}% of the {dtype} peak" if frac is not None else "")
            + (f"; {100 * roof:.1f}% of its roofline ({bound}-bound)" if roof is not None else ""))
