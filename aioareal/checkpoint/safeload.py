"""Read back the `.pt` files of a checkpoint without running anything they contain.

`torch.load` unpickles, and a pickle may name any function to call while it loads: a crafted
`trainer.pt` would run code the moment a run directory is resumed. Two layers keep that from
happening:

1. `scan` reads the archive's pickle opcode by opcode with `pickletools` (which parses and never
   executes) and refuses any global other than the few a checkpoint of ours names: `OrderedDict`,
   the tensor rebuild function and the typed storages. It also refuses TorchScript code and any
   second pickle in the archive. This is stricter than torch's own allow-list and does not depend
   on the torch version (`weights_only=True` could be bypassed before torch 2.6, CVE-2025-32434;
   pyproject allows older torch).
2. The load itself is `torch.load(weights_only=True)`, torch's restricted unpickler.

The scan also tells a refusal from corruption: a file whose archive or pickle is not well formed
(a truncated write, a disk fault) raises what the parser raises and is the caller's to treat as
unreadable; a well-formed file that names anything else raises `UnsafeFile`. Whoever adds a new
kind of object to a checkpoint adds its global to `PLAIN_GLOBALS`, or better stores it plainly.

`SafeReader`: torch.distributed.checkpoint (DCP) shards read without running anything a file contains.

DCP's own reader unpickles `.metadata` with plain `pickle.load`, and loads every non-tensor entry
with `torch.load(weights_only=False)`: either could run code planted in a run directory. Sharded
checkpoints of ours hold tensors only (the optimizer's plain settings go to `trainer.pt`, read by
`load_plain`, above), so `SafeReader` can be strict:

1. `.metadata` is read by an unpickler that builds nothing but DCP's metadata records, torch
   sizes, dtypes and layouts (and the path DCP stores with them);
2. every entry must be a tensor (which DCP reads with `torch.load(weights_only=True)`), and every
   shard file a plain name inside the checkpoint directory.
A file that names anything else is refused with `UnsafeFile`, as a crafted `.pt` file is.
"""
from __future__ import annotations

import os
import pickle
import pickletools
import re
import zipfile
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from ..errors import UserError

# Every global a checkpoint of ours names (torch.save, pickle protocol 2): dicts, lists, tuples,
# numbers and strings need none; tensors need the rebuild function and a typed storage class.
PLAIN_GLOBALS = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2"}
STORAGE = re.compile(r"torch\.[A-Za-z0-9]*Storage")
# What marks a zip as more than torch.save's one pickle plus raw storages and version records: a
# second pickle or TorchScript code, which torch before 2.6 would run even with weights_only=True.
# (A list of the members torch.save writes would be stricter, but torch adds records over time.)
FOREIGN_MEMBER = re.compile(r"(.*/)?(code/.*|[^/]*\.pkl)")
DATA_PICKLE = re.compile(r"[^/]+/data\.pkl")


class UnsafeFile(UserError):
    """A checkpoint file holds something a checkpoint never does: refused, nothing in it was run."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        super().__init__(f"{path}: refused to load: it holds {what}, which no checkpoint written by aioareal "
                         "holds and a file crafted to run code when loaded does; nothing in it was run. Resume "
                         "only run directories you trust, or delete this checkpoint to resume from an earlier one")


def load_plain(path: Path, map_location: torch.device | str | None = None) -> Any:
    """`torch.load` of a checkpoint file, after `scan` found only plain data in it."""
    scan(path)
    return torch.load(path, map_location=map_location, weights_only=True)


def scan(path: Path) -> None:
    """Raise `UnsafeFile` if `path` names anything but plain data; parser errors if it is corrupt."""
    with open(path, "rb") as f:
        is_zip = f.read(2) == b"PK"
        if not is_zip:
            f.seek(0)
            _globals(f)  # raises when it is no pickle at all: corrupt, not crafted
            raise UnsafeFile(path, "a bare pickle stream instead of the zip archive torch.save writes")
    with zipfile.ZipFile(path) as archive:  # BadZipFile for a truncated archive
        for info in archive.infolist():  # infolist, not names: a duplicated name must not hide a member
            if DATA_PICKLE.fullmatch(info.filename):
                with archive.open(info) as pickle:
                    _check_globals(path, _globals(pickle))
            elif FOREIGN_MEMBER.fullmatch(info.filename):
                raise UnsafeFile(path, f"a member {info.filename!r} (TorchScript code or a second pickle)")


def _check_globals(path: Path, names: list[str]) -> None:
    foreign = sorted({n for n in names if n not in PLAIN_GLOBALS and not STORAGE.fullmatch(n)})
    if foreign:
        raise UnsafeFile(path, f"a reference to {', '.join(foreign)}")


def _globals(stream: IO[bytes]) -> list[str]:
    """The globals a pickle names, as module.name; raises ValueError if it is not a whole pickle."""
    names = []
    for opcode, arg, _ in pickletools.genops(stream):
        if opcode.name in ("GLOBAL", "INST"):
            names.append(str(arg).replace(" ", "."))
        elif opcode.name == "STACK_GLOBAL":  # protocol 4+, which torch.save does not write
            names.append("a global built on the stack (STACK_GLOBAL)")
    return names


METADATA_FILE = ".metadata"
_DCP = "torch.distributed.checkpoint"
ALLOWED = {
    f"{_DCP}.metadata": {"Metadata", "ChunkStorageMetadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                         "TensorStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING"},
    f"{_DCP}.filesystem": {"_StorageInfo"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},  # looks a layout up by name
    "pathlib": {"PosixPath", "WindowsPath", "Path"},  # StorageMeta.checkpoint_id
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if name in ALLOWED.get(module, ()) or dtype:
            return super().find_class(module, name)
        raise UnsafeFile(self.path, f"a reference to {module}.{name}")


def read_metadata(directory: Path) -> Metadata:
    """The checkpoint's DCP metadata, checked: tensors only, shard files inside `directory`."""
    path = Path(directory) / METADATA_FILE
    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(f, path).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeFile(path, f"a {type(metadata).__name__} instead of DCP metadata")
    foreign = sorted(k for k, v in metadata.state_dict_metadata.items() if not isinstance(v, TensorStorageMetadata))
    if foreign:  # DCP would read these with torch.load(weights_only=False)
        raise UnsafeFile(path, f"non-tensor entries ({', '.join(foreign[:3])})")
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", "")
        if not name or os.path.basename(name) != name or name in (".", ".."):
            raise UnsafeFile(path, f"a shard file outside the checkpoint ({name!r})")
        if getattr(info, "transform_descriptors", None):
            raise UnsafeFile(path, f"stream transforms {info.transform_descriptors!r}")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file reader with `read_metadata` above."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def check_shards(directory: Path) -> None:
    """Raise if the metadata is refused or a shard file is missing or shorter than it says."""
    sizes: dict[str, int] = {}
    for info in (read_metadata(directory).storage_data or {}).values():
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sizes.items():
        actual = (Path(directory) / name).stat().st_size  # FileNotFoundError for a missing shard
        if actual < size:
            raise ValueError(f"{Path(directory) / name} holds {actual} bytes, its metadata says {size}")
