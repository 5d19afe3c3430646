"""aioareal: a fast, hackable asynchronous RL trainer for small language models.

From Python: `aioareal.train(...)`, `aioareal.evaluate(...)` and the `aioareal.Run` they speak of
(api/). They load on first use, so `import aioareal` (and `python -m aioareal --help`) stays light."""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Run", "evaluate", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'aioareal' has no attribute '{name}'")
