"""Whether a model name is a local path, and the error when that path is missing. No torch here: a
fresh run asks this before torch loads (run/early_checks.py), as the loaders do again later.

A hub name the loaders cannot fetch fails here in one line too (`check_hub`): offline, transformers
would retry each file five times with back-off, about a minute of retry lines before its error.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import UserError


def is_local_name(name: str) -> bool:
    """Whether `name` is a path (relative, absolute, home or existing), not a hub name (owner/name)."""
    return name.startswith((".", "/", "~")) or Path(name).exists() or name.count("/") > 1


def check_local(name: str) -> None:
    if is_local_name(name) and not Path(name).expanduser().exists():
        raise UserError(f"model.name '{name}': no such file or directory")


HUB_CONNECT_TIMEOUT_S = 3.0
_reachable: dict[str, bool] = {}  # endpoint -> whether it answered, asked once per process


def hub_reachable(endpoint: str) -> bool:
    """Whether a TCP connection to the hub endpoint's host opens within HUB_CONNECT_TIMEOUT_S."""
    if endpoint not in _reachable:
        url = urlsplit(endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            with socket.create_connection((url.hostname or "", port), timeout=HUB_CONNECT_TIMEOUT_S):
                _reachable[endpoint] = True
        except (OSError, UnicodeError):
            _reachable[endpoint] = False
    return _reachable[endpoint]


def _cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return any(isinstance(try_to_load_from_cache(name, f), str) for f in ("config.json", "tokenizer_config.json"))
    except Exception:  # a name that is no valid repository id is simply not cached
        return False


def check_hub(name: str) -> None:
    """For a hub name (not local): refuse at once one that is neither in the Hugging Face cache nor
    fetchable (offline mode, or the endpoint unreachable); one that is cached while the hub is out of
    reach loads from the cache, with the hub's offline mode switched on so nothing retries."""
    from huggingface_hub import constants

    cached = _cached(name)
    if not constants.HF_HUB_OFFLINE and hub_reachable(constants.ENDPOINT):
        return
    if cached:
        os.environ["HF_HUB_OFFLINE"] = "1"
        constants.HF_HUB_OFFLINE = True
        return
    host = urlsplit(constants.ENDPOINT).hostname
    why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"{host} cannot be reached"
    raise UserError(f"model.name '{name}': not a local path, a named offline model or a model in the Hugging Face "
                    f"cache, and {why}; give a local directory, a .gguf file or a named model (docs/models.md)")
