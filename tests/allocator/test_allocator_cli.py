"""`python -m aioareal` and run.allocator end to end: the allocator line it prints, and a named
allocator that is not installed refused in one line before anything loads."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aioareal import allocator

RUN = ["-m", "aioareal", "--steps", "1", "--no-dashboard", "model.name=random:tiny", "algo.batch_groups=2",
       "algo.group_size=2", "data.eval_size=2", "eval.every=0"]


def _aioareal(tmp_path, *keys: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (allocator.MARK, "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    return subprocess.run([sys.executable, *RUN, "--run-dir", str(tmp_path / "run"), *keys], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)


def test_the_run_names_its_allocator(tmp_path):
    out = _aioareal(tmp_path, "run.allocator=system")
    assert out.returncode == 0, out.stderr
    assert "allocator: system (run.allocator=system)" in out.stdout


@pytest.mark.skipif(allocator.library("jemalloc") is not None, reason="jemalloc is installed here")
def test_a_named_allocator_missing_is_refused_before_anything_loads(tmp_path):
    out = _aioareal(tmp_path, "run.allocator=jemalloc")
    assert out.returncode == 2
    assert "run.allocator=jemalloc, but this system has no jemalloc library" in out.stderr
    assert not (tmp_path / "run").exists()
