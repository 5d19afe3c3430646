"""A LoRA adapter directory as a model: its base with the adapter merged in, built once into a cache.

`model.name=DIR`, where DIR holds PEFT's two files (what a LoRA checkpoint keeps under adapter/, what
PEFT and TRL save), loads as its base with `W + (alpha / r) * B @ A` merged into each adapted matrix,
so every loader reads it as any Hugging Face model. The base is the adapter config's
`base_model_name_or_path` (a relative path taken from the adapter's directory when it exists there).
Entries live in `<cache root>/adapters/<digest>/`, keyed by the adapter's bytes and the base, built
and renamed into place under a file lock as gguf.py does.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError
from ..io import exclusive_lock
from .gguf import KEY_DIGITS, cache_root, file_digest

ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"  # PEFT's names
MANIFEST = "aioareal-adapter.json"  # written last inside an entry
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def adapter_dir(name: str) -> Path | None:
    """The adapter directory `name` points to, or None (a model directory, a file, a hub name)."""
    path = Path(name).expanduser()
    if not (path / ADAPTER_CONFIG).is_file() or (path / "config.json").exists():
        return None
    if not (path / ADAPTER_WEIGHTS).is_file():
        raise UserError(f"model.name '{name}': an adapter directory without {ADAPTER_WEIGHTS} (a pickled "
                        "adapter_model.bin is not loaded: unpickling can run code)")
    return path


def base_name(adapter: Path) -> str:
    """The model `adapter` was trained on, as its config names it."""
    try:
        config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{adapter / ADAPTER_CONFIG}: not a readable JSON adapter config ({e})") from None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base.strip():
        raise UserError(f"{adapter / ADAPTER_CONFIG}: no base_model_name_or_path; set it to the model the "
                        "adapter was trained on")
    beside = adapter / base
    return str(beside) if not Path(base).is_absolute() and beside.exists() else base


def cached(adapter: Path, base: str, build: Callable[[Path], None]) -> Path:
    """The merged directory of `adapter` over the resolved `base`, made by `build(tmp)` when absent."""
    sha = hashlib.sha256(base.encode())
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        sha.update(file_digest(adapter / name).encode())
    digest = sha.hexdigest()
    entry = cache_root() / "adapters" / digest[:KEY_DIGITS]
    if _complete(entry, digest):
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(entry.parent / f".{entry.name}.lock"):
        if _complete(entry, digest):
            return entry
        print(f"merging adapter {adapter} into {base} once, into {entry}", flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
        try:
            build(tmp)
            (tmp / MANIFEST).write_text(json.dumps({"adapter": str(adapter.resolve()), "base": base,
                                                    "sha256": digest}, indent=2) + "\n")
            if entry.exists():
                shutil.rmtree(entry)
            os.rename(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def copy_side_files(base: Path, out: Path) -> None:
    """The base directory's tokenizer, chat template and generation config, copied as they are."""
    for f in base.iterdir():
        skip = f.name.endswith(WEIGHT_SUFFIXES) or f.name.endswith(".index.json") or f.name.startswith("aioareal-")
        if f.is_file() and not skip and not (out / f.name).exists():
            shutil.copyfile(f, out / f.name)


def _complete(entry: Path, digest: str) -> bool:
    try:
        return json.loads((entry / MANIFEST).read_text()).get("sha256") == digest
    except (OSError, ValueError, AttributeError):
        return False
