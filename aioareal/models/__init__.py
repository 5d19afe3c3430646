"""Models and tokenizers: hub/local loading, the offline character tokenizer, named shapes. The
loaders are re-exported lazily, so a light module (local_names) imports without torch."""
from __future__ import annotations

from typing import Any

__all__ = ["eos_token_ids", "load_model", "load_tokenizer", "random_model", "resolve_dtype"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import load_policy

        return getattr(load_policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
