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
"""
from __future__ import annotations

import pickletools
import re
import zipfile
from pathlib import Path
from typing import IO, Any

import torch

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
