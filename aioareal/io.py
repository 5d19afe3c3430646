"""Crash-safe file writes: whole files by temp + rename, JSONL by single appends that resume repairs;
lock files opened so that a planted one is refused, never followed."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import DataError, UserError


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader (or a crash) sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # a full disk: the file named, so that it is one line (errors.guarded)
        Path(tmp).unlink(missing_ok=True)
        raise named(e, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def named(e: OSError, path: Any) -> OSError:
    """`e` with the file it was writing when the call (a write, a flush) did not say: no space left
    on a device is the environment's doing, one line naming the file, never a traceback."""
    if e.filename is not None or not isinstance(path, (str, Path)):
        return e
    return type(e)(e.errno, e.strerror or str(e), str(path))


def open_regular(path: str | Path, flags: int, what: str) -> int:
    """Open (creating) `path`, a plain file aioareal writes (`what` names it), and return its
    close-on-exec descriptor. A symbolic link in its place is not followed (its target would be
    written) and a FIFO must not block the open: anything but a regular file is a one-line UserError."""
    flags |= os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    refusal = (f"{path}: not a regular file (a symbolic link, FIFO or folder); {what} is a plain file "
               "aioareal writes, so remove it if the directory is yours")
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise UserError(refusal) from None
        raise UserError(f"{path}: cannot open {what} ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(refusal)
    os.set_blocking(fd, True)
    return fd


def open_lock_file(path: str | Path) -> int:
    """A lock file's descriptor for flock (`open_regular`)."""
    return open_regular(path, os.O_RDWR, "a lock file")


def open_append(path: str | Path) -> Any:
    """A text file opened for appending JSONL rows (`open_regular`): a run's metrics and samples."""
    return os.fdopen(open_regular(path, os.O_WRONLY | os.O_APPEND, "a run's log file"), "a", encoding="utf-8")


def refuse_odd(path: str | Path) -> None:
    """A one-line UserError when something other than a regular file stands at `path` (a link, a
    FIFO, a folder), before a reader follows, blocks on or rewrites it; nothing there is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file (a symbolic link, FIFO or folder); aioareal reads and "
                        "rewrites it as a plain file, so remove it if the directory is yours")


@contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """Hold an flock on the lock file `path` (waiting for other holders) for the with-block."""
    fd = open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # frees the flock


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def append_jsonl(f: Any, rows: list[dict[str, Any]]) -> None:
    """Append rows to an open text file in one write, then flush (a crash tears at most the last line)."""
    if rows:
        text = "".join(json.dumps(r, allow_nan=False, default=_jsonable) + "\n" for r in rows)
        try:
            f.write(text)
            f.flush()
        except OSError as e:
            raise named(e, getattr(f, "name", None)) from None


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def jsonl_lines(path: str | Path) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of each non-blank line, text None where the bytes are not UTF-8 (a torn
    multi-byte character at the end, or a file that is not text): decoding per line lets the
    caller name the line instead of failing on the whole file."""
    with Path(path).open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield lineno, None
                continue
            if line.strip():
                yield lineno, line


def parse_row(line: str | None) -> dict[str, Any]:
    """One JSONL line as a JSON object, or ValueError saying what it is instead."""
    if line is None:
        raise ValueError("not UTF-8 text")
    try:
        row = loads_bounded(line)
    except RecursionError:  # loads_bounded's scan makes this rare: a last resort
        raise ValueError("nested too deeply") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    return row


MAX_JSON_DEPTH = 100  # nesting a JSON value read from a user's file may have (docs/reliability.md#bounded-readers)


def loads_bounded(text: str) -> Any:
    """json.loads, refusing (ValueError, as for any malformed JSON) a value nested deeper than
    MAX_JSON_DEPTH, which would otherwise end in a RecursionError inside the parser. A line with few
    brackets is passed straight through; only one with many is scanned, once, outside strings."""
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth(text) > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return json.loads(text)


def _depth(text: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def row_at(line: str | None, where: str) -> dict[str, Any]:
    """`parse_row`, its ValueError made the one-line DataError naming `where` (file:line)."""
    try:
        return parse_row(line)
    except ValueError as e:
        raise DataError(f"{where}: malformed JSON line ({e})") from None


def iter_jsonl(path: str | Path, skip_bad: bool = False, bad: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Yield JSON objects from a JSONL file; a malformed line is an error naming file and line number."""
    path = Path(path)
    for lineno, line in jsonl_lines(path):
        try:
            row = parse_row(line)
        except ValueError:
            if skip_bad:
                if bad is not None:
                    bad.append(lineno)
                continue
            row = row_at(line, f"{path}:{lineno}")  # raises the line's one-line error
        yield row


def repair_jsonl(path: str | Path, keep: Any = None) -> int:
    """Drop a torn last line and rows for which `keep(row)` is false; rewrite atomically. Returns rows
    kept. Any other unreadable line (not JSON, not an object, not UTF-8) is not a crash's doing: a
    DataError naming it, the file left as it is."""
    path = Path(path)
    if not path.exists():
        return 0
    lines = list(jsonl_lines(path))
    rows = []
    for i, (lineno, line) in enumerate(lines):
        try:
            row = parse_row(line)
        except ValueError as e:
            if i == len(lines) - 1:
                continue  # torn by a crash mid-write: only ever the last line
            raise DataError(f"{path}:{lineno}: malformed line ({e}); fix or remove it to resume") from None
        try:
            kept = keep is None or keep(row)
        except ValueError as e:  # `keep` found a field of the wrong type
            raise DataError(f"{path}:{lineno}: {e}; fix or remove the line to resume") from None
        if kept:
            rows.append(row)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)
