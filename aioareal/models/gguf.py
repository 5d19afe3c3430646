"""GGUF files as models: each file (or a directory holding exactly one) is dequantized once
(gguf_convert.py) into a cached Hugging Face directory that every later load reads, rather than on
every load by transformers, and no other part of a run cares where the weights came from.

Entries live in `<cache root>/gguf/<first 16 hex digits of the file's sha256>/` (the root is
$AIOAREAL_CACHE_DIR, else ~/.cache/aioareal), keyed by content. An entry is built in a temporary
directory and renamed into place when complete, under a file lock: a killed conversion leaves
nothing a later run trusts, and concurrent runs (torchrun ranks) convert once.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..errors import UserError
from ..io import exclusive_lock
from .gguf_convert import convert

ENV_CACHE = "AIOAREAL_CACHE_DIR"
MANIFEST = "aioareal-gguf.json"  # written last inside an entry: what it was made from
FORMAT = 2  # bump when the conversion changes, so stale entries are rebuilt (2: gguf_pre_tokenizer kept)
KEY_DIGITS = 16
CHUNK = 1 << 20


def cache_root() -> Path:
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "aioareal").expanduser()


def gguf_file(name: str) -> Path | None:
    """The GGUF file `name` points to (a `.gguf` file, or a directory without config.json holding one)."""
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise UserError(f"model.name '{name}': no such GGUF file")
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise UserError(f"model.name '{name}': the directory holds {len(found)} GGUF files "
                        f"({', '.join(p.name for p in found)}); name the one to load")
    return found[0] if found else None


def cached_gguf(path: Path) -> Path:
    """The converted directory for the GGUF file at `path`, converting it first if needed."""
    digest = file_digest(path)
    entry = cache_root() / "gguf" / digest[:KEY_DIGITS]
    if _complete(entry, digest):
        return entry
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot write the GGUF cache {entry.parent} ({e.strerror}); set {ENV_CACHE} "
                        "to a writable directory") from None
    with exclusive_lock(entry.parent / f".{entry.name}.lock"):
        if not _complete(entry, digest):  # another process may have built it while this one waited
            _build(path, entry, digest)
    return entry


def file_digest(path: Path) -> str:
    """sha256 of the file's contents, hashed once per process per (size, mtime) of the file."""
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def _complete(entry: Path, digest: str) -> bool:
    """Trusted once its manifest (written last) names this file's contents and the current FORMAT."""
    manifest = entry / MANIFEST
    if not manifest.is_file():
        return False
    made = json.loads(manifest.read_text())
    return made.get("format") == FORMAT and made.get("sha256") == digest


def _build(path: Path, entry: Path, digest: str) -> None:
    """Convert into a temporary directory beside `entry`, then rename it into place (holding the lock)."""
    for stale in entry.parent.glob(f".{entry.name}.tmp-*"):  # left by a killed conversion
        shutil.rmtree(stale, ignore_errors=True)
    print(f"converting {path} once into {entry} (later loads read it from there)", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    try:
        start = time.perf_counter()
        convert(path, tmp)
        manifest = {"format": FORMAT, "source": str(path.resolve()), "sha256": digest,
                    "bytes": path.stat().st_size, "seconds": round(time.perf_counter() - start, 1)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if entry.exists():  # an entry of an older FORMAT (or another file's): replaced, never merged
            shutil.rmtree(entry)
        os.rename(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
