"""Shared fixtures. The warm-started tiny model is cached under runs/_warmup (as for users), so
the suite trains it once per checkout."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO.parent / "shared" / "data" / "gsm8k"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _torch_threads():
    torch.set_num_threads(2)
    yield


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    from aioareal.config import load_config
    from aioareal.run.warmup import ensure_tiny

    return ensure_tiny(load_config(), log=lambda *_: None)
