"""Shared fixtures. The warm-started tiny model is cached under runs/_warmup (as for users), so
the suite trains it once per checkout."""
from __future__ import annotations

import os
from pathlib import Path

import gsm8k_data
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Under pytest-xdist (`-n 2`, as .ci/run runs) the cores are shared between the workers: each
# worker's torch, and every run a test starts in a subprocess, gets its share, so two workers on two
# cores do not oversubscribe them (docs/architecture.md#threads-on-the-cpu).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
TORCH_THREADS = 2 if _WORKERS == 1 else max(1, _CORES // _WORKERS)
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(TORCH_THREADS))


@pytest.fixture(autouse=True)
def _torch_threads():
    torch.set_num_threads(TORCH_THREADS)
    yield


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from aioareal.config import load_config
    from aioareal.run.warmup import ensure_tiny

    return ensure_tiny(load_config(), log=lambda *_: None)


@pytest.fixture(scope="session", params=["slice", pytest.param("full", marks=pytest.mark.slow)])
def gsm8k_test(request) -> gsm8k_data.GSM8KTest:
    """A GSM8K check runs on the committed slice, and (slow) on the full test set where present
    (gsm8k_data.py)."""
    return gsm8k_data.gsm8k_file(request.param)
