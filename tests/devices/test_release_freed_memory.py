"""devices.release_freed_memory: between phases on the CPU glibc's malloc_trim; nothing where
tcmalloc is in the process (allocator.py: its caches serve the next phase), nothing on a GPU."""
from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest
import torch

from aioareal import devices


def test_glibc_trims_and_tcmalloc_keeps_its_caches(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(devices, "_malloc_trim", lambda: lambda pad: calls.append(f"trim {pad}"))
    monkeypatch.setattr(devices, "_tcmalloc_release", lambda: None)
    devices.release_freed_memory(torch.device("cpu"))
    monkeypatch.setattr(devices, "_tcmalloc_release", lambda: lambda: calls.append("tcmalloc"))
    devices.release_freed_memory(torch.device("cpu"))
    devices.release_freed_memory(torch.device("meta"))  # not the CPU: nothing
    assert calls == ["trim 0"]


def test_glibc_alone_has_no_tcmalloc_release():
    code = "from aioareal import devices; print(devices._tcmalloc_release() is None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert out.stdout.strip() == "True", out.stderr


@pytest.mark.skipif(not ctypes.util.find_library("tcmalloc_minimal"), reason="tcmalloc is not installed here")
def test_a_process_with_tcmalloc_preloaded_finds_its_release():
    code = "from aioareal import devices; f = devices._tcmalloc_release(); f(); print(f is not None)"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path),
           "LD_PRELOAD": ctypes.util.find_library("tcmalloc_minimal")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.stdout.strip() == "True", out.stderr
