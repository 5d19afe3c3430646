"""Which device the generator and the trainer of this process use."""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import torch

from .errors import UserError

T = TypeVar("T")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # either gives the CPU bf16 dot-product units


def resolve_device(name: str, role: str, rank_slot: tuple[int, int] | None = None) -> torch.device:
    """'auto': the generator on cuda:0, the trainer on cuda:1 when there are two GPUs, else both on
    cuda:0; the CPU when there is no GPU. Under torchrun `rank_slot` is (LOCAL_RANK,
    rollout.devices_per_rank): rank r's cell takes GPUs r*d .. r*d+d-1, the generator the first,
    the trainer the last (the same GPU when d = 1)."""
    if name != "auto":
        try:
            device = torch.device(name)
        except (RuntimeError, ValueError):
            raise UserError(f"rollout.{role}_device: expected auto, cpu, cuda or cuda:N, got {name!r}") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"rollout.{role}_device is '{name}' but no CUDA device is available")
        return device
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if rank_slot is not None:
        local_rank, per_rank = rank_slot
        index = local_rank * per_rank + (per_rank - 1 if role == "train" else 0)
        if index >= torch.cuda.device_count():
            raise UserError(f"rank {local_rank} of this node needs GPU {index} (rollout.devices_per_rank="
                            f"{per_rank}) but the node has {torch.cuda.device_count()}; start fewer ranks per node "
                            "(torchrun --nproc-per-node) or lower rollout.devices_per_rank")
        return torch.device("cuda", index)
    return torch.device("cuda", 1 if role == "train" and torch.cuda.device_count() > 1 else 0)


def one_cpu_team(devices: list[torch.device], overlapping: bool) -> bool:
    """Whether the generator and the trainer should run their torch ops on one shared thread, the
    process's only OpenMP team (docs/architecture.md#threads-on-the-cpu): both on the CPU and
    taking turns (sync mode). torch's GNU OpenMP gives every thread that runs a parallel op a team of
    its own; with more of them than cores it puts idle workers to sleep at once, and every small op
    then waits for a wake-up (docs/log/2026-11-avx512-cpu.md)."""
    return not overlapping and all(d.type == "cpu" for d in devices)


def cpu_threads(devices: list[torch.device], setting: int, overlapping: bool) -> int | None:
    """Intra-op threads for this process (run.cpu_threads), or None to leave torch's choice.

    The generator and the trainer each run their torch ops on a thread of their own, and on the
    CPU each of those threads leads a team of intra-op (OpenMP) threads as wide as the machine.
    When the two sides compute at once (`overlapping`: one-step and async modes) and both are on
    the CPU, two full-width teams oversubscribe the cores, and a team whose barrier waits on a
    thread the OS has descheduled stalls every op; so 0 (auto) splits the cores between them. In
    sync mode the sides take turns and each keeps every core. OMP_NUM_THREADS, when set, wins."""
    if setting > 0:
        return setting
    on_cpu = sum(d.type == "cpu" for d in devices)
    if not overlapping or on_cpu < 2 or os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // on_cpu)


def on_passing_thread(fn: Callable[[], T], width: int) -> T:
    """fn() on a thread of its own at `width` intra-op threads; the thread exits after it and takes
    its OpenMP team along, so the calling thread never leads one (docs/architecture.md#threads-on-
    the-cpu: heavy setup at full width, then one team for the run's torch work)."""
    with ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(width,)) as passing:
        return passing.submit(fn).result()


def with_run_threads(work: Callable[[int | None], T], devices: list[torch.device], overlapping: bool,
                     setting: int = 0) -> T:
    """`work(one_thread)` under the threads a run takes (docs/architecture.md#threads-on-the-cpu): on
    the CPU with sides taking turns, one team for both (`one_thread`, its width), `work` on a
    passing thread at that width, and the calling thread at width 1 afterwards; otherwise
    `work(None)` here, the cores split between overlapping sides (`cpu_threads`, `setting` being
    run.cpu_threads). The caller restores the width when it is done (`threads_restored`)."""
    threads = cpu_threads(devices, setting, overlapping)
    if not one_cpu_team(devices, overlapping):
        if threads:
            torch.set_num_threads(threads)  # process-wide: every torch thread's team takes this width
        return work(None)
    team = threads or torch.get_num_threads()
    result = on_passing_thread(lambda: work(team), team)
    torch.set_num_threads(1)
    return result


@contextlib.contextmanager
def threads_restored() -> Iterator[None]:
    """torch's intra-op thread count as it was on entry, whatever the block set it to."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def release_freed_memory(device: torch.device) -> None:
    """Hand the heap memory freed since the last call back to the OS (glibc's `malloc_trim`), on the
    CPU. Each thread allocates from a heap of its own, and a heap keeps what a phase freed: the
    trainer's activations stay resident while the generator decodes, and the generator's buffers
    while the trainer trains, so a process holds the sum of its phases' peaks rather than their
    largest. Called between phases (after a training step, after an evaluation); costs a walk of the
    free lists. A no-op on a GPU, and with tcmalloc in the process (allocator.py): its caches serve
    every phase, and handing its free pages back between phases (`MallocExtension_ReleaseFreeMemory`)
    lowered no peak of the sums config and made its steps slower, each phase faulting its pages in
    again (docs/log/2026-11-memory-4gib.md)."""
    if device.type != "cpu" or _tcmalloc_release() is not None:
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, where glibc's allocator controls live; None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _malloc_trim():
    return getattr(_libc(), "malloc_trim", None)


@functools.cache
def _tcmalloc_release():
    """tcmalloc's `MallocExtension_ReleaseFreeMemory` where tcmalloc is loaded (LD_PRELOAD), else None."""
    try:
        return getattr(ctypes.CDLL(None), "MallocExtension_ReleaseFreeMemory", None)
    except OSError:
        return None


M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h


def fix_mmap_threshold(mib: int) -> bool:
    """Serve every allocation of `mib` MiB or more from pages of its own (glibc's M_MMAP_THRESHOLD),
    handed back to the OS as soon as it is freed, instead of the heaps, which keep freed blocks
    and fragment under a training step's tensors of 1-32 MB. It also stops glibc raising the
    threshold after large frees. Costs page faults on each such tensor's first touch: the sums
    config's loss phase took 1.5x as long at 1 MiB (docs/log/2026-11-memory.md). Process-wide.
    False where glibc is not the allocator."""
    mallopt = getattr(_libc(), "mallopt", None)
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, mib << 20) == 1


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


def emulated_bf16(keys: dict[str, str], flags: set[str] | None) -> str | None:
    """One line when bf16 is asked of a CPU that only emulates it (`keys`: config key -> dtype of
    each side that runs on the CPU): its matmuls run many times slower than fp32's there (a Gemma
    3 270M step took minutes instead of seconds on an AVX2-only EPYC). None where bf16 is native,
    not asked, or the flags cannot be read."""
    asked = [key for key, dtype in keys.items() if dtype in ("bfloat16", "bf16")]
    if not asked or flags is None or bf16_units(flags):
        return None
    fix = " ".join(f"{key}=float32" for key in keys)
    return (f"warning: {' and '.join(asked)} = bfloat16, but this CPU lists neither {' nor '.join(BF16_FLAGS)}: "
            f"bf16 matmuls are emulated, many times slower than float32; set {fix}")
