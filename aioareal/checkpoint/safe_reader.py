"""Read torch.distributed.checkpoint (DCP) shards without running anything a file contains.

DCP's own reader unpickles `.metadata` with plain `pickle.load`, and loads every non-tensor entry
with `torch.load(weights_only=False)`: either could run code planted in a run directory. Sharded
checkpoints of ours hold tensors only (the optimizer's plain settings go to `trainer.pt`, read by
`safeload.load_plain`), so `SafeReader` can be strict:

1. `.metadata` is read by an unpickler that builds nothing but DCP's metadata records, torch
   sizes, dtypes and layouts (and the path DCP stores with them);
2. every entry must be a tensor (which DCP reads with `torch.load(weights_only=True)`), and every
   shard file a plain name inside the checkpoint directory.
A file that names anything else is refused with `UnsafeFile`, as a crafted `.pt` file is.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from .safeload import UnsafeFile

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
