"""run.mmap_threshold_mb (devices.fix_mmap_threshold): with it, a freed block of a few MB goes back
to the OS at once; without it, glibc keeps it in the heap once a larger free has raised its
adaptive threshold, which is how a training step's 1-32 MB tensors pile up in RSS. Each side runs
in a process of its own (the setting is process-wide), allocating through libc itself."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aioareal.config import load_config
from aioareal.errors import UserError

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import ctypes, ctypes.util, sys
from aioareal.devices import fix_mmap_threshold
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss_kib():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
def touched(n):
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    return p
fixed = sys.argv[1] == "fixed" and fix_mmap_threshold(1)
libc.free(touched(24 << 20))  # a large free: glibc's adaptive threshold rises to 24 MB
blocks = [touched(4 << 20) for _ in range(8)]  # 32 MB in blocks of 4 MB, under that threshold
before = rss_kib()
for p in blocks:
    libc.free(p)
print(fixed, before - rss_kib())
"""


def returned_kib(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # glibc's own settings, if any
    out = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True)
    fixed, returned = out.stdout.split()
    return fixed, int(returned)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_go_back_to_the_os_only_with_the_threshold_fixed():
    fixed, returned = returned_kib("fixed")
    assert fixed == "True" and returned >= 30 * 1024  # all 32 MB handed back at once
    fixed, returned = returned_kib("adaptive")
    assert fixed == "False" and returned < 8 * 1024  # kept by the heap (a free at its top may go back)


def test_the_key_is_bounded_and_the_4gib_config_sets_all_three_levers():
    with pytest.raises(UserError, match=r"run.mmap_threshold_mb.*\[0, 32\]"):
        load_config(overrides=["run.mmap_threshold_mb=64"])
    config = load_config(path=REPO / "configs" / "smollm2-sums-4gib.yaml")
    assert (config.run.mmap_threshold_mb, config.train.optimizer_moments, config.model.gradient_checkpointing) == (
        1, "bfloat16", True)
