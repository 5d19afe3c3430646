"""The completions of every prompt `eval` has finished, kept as each prompt finishes, so that an
evaluation stopped part-way (a kill, Ctrl-C, a closed laptop) continues where it stopped when the same
command runs again with the same --out: GSM8K's 1,319 prompts take about half an hour on two cores.

OUT/eval.progress.jsonl holds one line per finished prompt: the key of its phase (a digest of the
target's model, the protocol, the decoding settings, the seed and every prompt's token ids), the
prompt's index and its completions' token ids and finish reasons. Scoring runs again at the end from
the tokens, so a kept prompt costs nothing but a decode. A line counts only under the key it was
written with: changed settings, data or weights start afresh. A torn or malformed line (the kill
came mid-write, or the file is not ours) is skipped, never trusted. The file is removed when the
evaluation completes.

Greedy completions continue exactly; the sampled ones of prompts not yet done are new draws of the
same seed (the engine's one random stream does not resume), as valid a sample as the first run's."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import one_line
from ..group import Completion
from ..io import append_jsonl, open_regular, parse_row

FILE = "eval.progress.jsonl"
FINISH_REASONS = ("stop", "stop_string", "length")


def phase_key(*parts: Any, prompt_ids: Sequence[list[int]]) -> str:
    """The digest a kept prompt is filed under: `parts` (JSON values naming the target, its weights,
    the protocol and decoding settings) and every prompt's token ids."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for ids in prompt_ids:
        digest.update(json.dumps(ids).encode())
    return digest.hexdigest()


def weights_stamp(source: str) -> list[Any]:
    """What changes when the weights at `source` are rewritten in place: each file's name, size and
    modification time (a directory's files, or the file itself; nothing for a hub name)."""
    path = Path(source)
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path] if path.is_file() else []
    return [(str(f.relative_to(path)) if path.is_dir() else f.name, f.stat().st_size, f.stat().st_mtime_ns)
            for f in files]


class Journal:
    """The kept prompts of OUT, read once at the start; `keeper(key)` appends each finished one."""

    def __init__(self, out: Path) -> None:
        self.path = out / FILE
        self.kept: dict[str, dict[int, list[Completion]]] = {}
        # One descriptor, never following a link nor waiting on a FIFO, read and then appended to.
        fd = open_regular(self.path, os.O_RDWR | os.O_APPEND, "eval's progress file")
        self.file = open(fd, "a+", encoding="utf-8", errors="strict", newline="\n")
        with open(fd, "rb", closefd=False) as raw:  # the same descriptor, read from the start
            raw.seek(0)
            data = raw.read()
        for line in data.split(b"\n"):
            if line.strip() and (row := _kept_row(line)) is not None:
                self.kept.setdefault(row[0], {})[row[1]] = row[2]
        if data and not data.endswith(b"\n"):
            self.file.write("\n")  # a torn last line ends here: the next prompt's line stays whole
            self.file.flush()

    def take(self, key: str, prompts: int, size: int, label: str, vocab: int,
             max_new_tokens: int) -> dict[int, list[Completion]]:
        """The kept completions of `key`'s phase (of `prompts` prompts, `size` completions each, named
        `label`), said aloud; a prompt with another count of completions, or one no tokenizer of `vocab`
        ids could decode, or longer than the limit, is not ours."""
        def fits(completions: list[Completion]) -> bool:
            return len(completions) == size and all(
                len(c.tokens) <= max_new_tokens and all(t < vocab for t in c.tokens) for c in completions)
        kept = {i: c for i, c in self.kept.get(key, {}).items() if i < prompts and fits(c)}
        if kept:
            print(one_line(f"{label}: {len(kept)} of {prompts} prompts kept from {self.path}; continuing"),
                  file=sys.stderr, flush=True)
        return kept

    def keeper(self, key: str) -> Callable[[int, list[Completion]], None]:
        def keep(index: int, completions: list[Completion]) -> None:
            append_jsonl(self.file, [{"key": key, "prompt": index, "tokens": [c.tokens for c in completions],
                                      "finish": [c.finish_reason for c in completions]}])
        return keep

    def close(self, complete: bool) -> None:
        """Close the file; remove it when the evaluation completed (its rows are in eval.jsonl)."""
        self.file.close()
        if complete:
            self.path.unlink(missing_ok=True)


def _kept_row(raw: bytes) -> tuple[str, int, list[Completion]] | None:
    """(key, prompt index, completions) of one line, or None where it is torn or not of our shape."""
    try:
        row = parse_row(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        return None
    key, index, tokens, finish = row.get("key"), row.get("prompt"), row.get("tokens"), row.get("finish")
    shaped = (isinstance(key, str) and type(index) is int and index >= 0 and isinstance(tokens, list)
              and isinstance(finish, list) and len(tokens) == len(finish) > 0
              and all(f in FINISH_REASONS for f in finish)
              and all(isinstance(ids, list) and all(type(t) is int and t >= 0 for t in ids) for ids in tokens))
    if not shaped:
        return None
    return key, index, [Completion(tokens=ids, finish_reason=f) for ids, f in zip(tokens, finish)]
