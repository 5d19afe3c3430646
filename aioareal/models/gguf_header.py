"""A bounded walk over a GGUF file's header before any GGUF reader sees it (docs/reliability.md#bounded-readers):
the `gguf` reader trusts claimed counts, so here each is checked against the bytes left before use,
and nothing is allocated in proportion to one (string arrays are walked at least 8 bytes a step).
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from ..errors import UserError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 4
DEFAULT_ALIGNMENT = 32
# Value types of the GGUF spec -> their fixed size in bytes (strings and arrays are variable).
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32, BOOL = 8, 9, 4, 7


class _Bounded:
    """Reads a file front to back, refusing any read or skip past its end."""

    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self.f, self.size, self.path, self.pos = f, size, path, 0

    def fail(self, what: str) -> UserError:
        return UserError(f"{self.path}: not a readable GGUF file ({what} at byte {self.pos}); it may be "
                         "truncated or corrupt: download or copy it again")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.size - self.pos:
            raise self.fail(f"{what} claims {n} bytes, {self.size - self.pos} left in the file")
        data = self.f.read(n)
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise self.fail(f"{what} claims {n} bytes, {self.size - self.pos} left in the file")
        self.pos += n
        self.f.seek(self.pos)

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> bytes:
        return self.take(self.u64(f"{what}'s length"), what)


# Metadata read on the way (short strings and bools) that transformers' reader drops (gguf_convert.py).
KEPT = {b"tokenizer.ggml.pre": STRING, b"tokenizer.ggml.add_bos_token": BOOL}
MAX_KEPT_STRING = 64


def check_gguf_header(path: Path) -> dict[str, str | bool]:
    """Walk the file's header, metadata and tensor table within its size (a one-line UserError at the
    first claim it cannot hold); returns the KEPT metadata it has, by key."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        r = _Bounded(f, size, path)
        if size < 4 or r.take(4, "the magic number") != MAGIC:
            raise r.fail("no GGUF magic number")
        version = r.u32("the version")
        if version not in VERSIONS:
            raise r.fail(f"version {version}, expected one of {VERSIONS}")
        tensors, entries = r.u64("the tensor count"), r.u64("the metadata count")
        # Each metadata entry takes at least 12 bytes (key length, value type), each tensor 28.
        if entries * 12 + tensors * 28 > size - r.pos:
            raise r.fail(f"{entries} metadata entries and {tensors} tensors claimed")
        alignment = DEFAULT_ALIGNMENT
        kept: dict[str, str | bool] = {}
        for _ in range(entries):
            key = r.string("a metadata key")
            kind = r.u32("a value type")
            if key == b"general.alignment" and kind == UINT32:
                alignment = r.u32("general.alignment")
                if alignment == 0 or alignment & (alignment - 1):
                    raise r.fail(f"general.alignment {alignment}, expected a power of two")
            elif KEPT.get(key) == kind == BOOL:
                kept[key.decode()] = r.take(1, key.decode()) != b"\0"
            elif KEPT.get(key) == kind == STRING and (length := r.u64("a string's length")) <= MAX_KEPT_STRING:
                kept[key.decode()] = r.take(length, key.decode()).decode("utf-8", errors="replace")
            elif KEPT.get(key) == kind == STRING:
                r.skip(length, "a string")
            else:
                _skip_value(r, kind, 0)
        spans = [_tensor_info(r) for _ in range(tensors)]
        data_start = -(-r.pos // alignment) * alignment
        for name, offset, nbytes in spans:
            if data_start + offset + nbytes > size:
                raise r.fail(f"tensor {name!r} claims bytes {offset}..{offset + nbytes} of a "
                             f"{max(size - data_start, 0)}-byte data section")
    return kept


def _skip_value(r: _Bounded, kind: int, depth: int) -> None:
    if kind in FIXED:
        r.skip(FIXED[kind], "a value")
    elif kind == STRING:
        r.skip(r.u64("a string's length"), "a string")
    elif kind == ARRAY:
        if depth >= MAX_ARRAY_NESTING:
            raise r.fail(f"arrays nested deeper than {MAX_ARRAY_NESTING}")
        item, count = r.u32("an array's item type"), r.u64("an array's length")
        if item in FIXED:
            r.skip(count * FIXED[item], f"an array of {count} items")
            return
        if count * 8 > r.size - r.pos:  # a string or an array item takes at least 8 bytes
            raise r.fail(f"an array claims {count} items, {r.size - r.pos} bytes left in the file")
        for _ in range(count):
            _skip_value(r, item, depth + 1)
    else:
        raise r.fail(f"unknown value type {kind}")


def _tensor_info(r: _Bounded) -> tuple[str, int, int]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    name = r.string("a tensor name").decode("utf-8", "replace")[:100]
    dims = r.u32(f"tensor {name!r}'s dimension count")
    if dims > MAX_DIMS:
        raise r.fail(f"tensor {name!r} has {dims} dimensions, at most {MAX_DIMS} allowed")
    elements = 1
    for _ in range(dims):
        elements *= r.u64(f"tensor {name!r}'s shape")
    kind = r.u32(f"tensor {name!r}'s type")
    offset = r.u64(f"tensor {name!r}'s offset")
    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise r.fail(f"tensor {name!r} has unknown type {kind}") from None
    return name, offset, -(-elements // block) * block_bytes
