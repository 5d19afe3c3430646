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

import errno
import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..group import Completion
from ..io import append_jsonl, jsonl_lines, parse_row

FILE = "eval.progress.jsonl"
FINISH_REASONS = ("stop", "length")


def phase_key(*parts: Any, prompt_ids: Sequence[list[int]]) -> str:
    """The digest a kept prompt is filed under: `parts` (JSON values naming the target, protocol and
    decoding settings) and every prompt's token ids."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode())
    for ids in prompt_ids:
        digest.update(json.dumps(ids).encode())
    return digest.hexdigest()


class Journal:
    """The kept prompts of OUT, read once at the start; `keeper(key)` appends each finished one."""

    def __init__(self, out: Path) -> None:
        self.path = out / FILE
        self.kept: dict[str, dict[int, list[Completion]]] = {}
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            raise UserError(f"{self.path}: not a regular file (a symbolic link or folder); eval keeps its "
                            "progress there, so remove it if the directory is yours")
        if self.path.exists():
            for _, line in jsonl_lines(self.path):
                if (row := _kept_row(line)) is not None:
                    self.kept.setdefault(row[0], {})[row[1]] = row[2]
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:  # planted between the check and the open
                raise UserError(f"{self.path}: a symbolic link; eval does not follow it") from None
            raise
        self.file = os.fdopen(fd, "a", encoding="utf-8")

    def take(self, key: str, prompts: int, label: str, vocab: int, max_new_tokens: int) -> dict[int, list[Completion]]:
        """The kept completions of `key`'s phase (of `prompts` prompts, named `label`), said aloud;
        a completion no tokenizer of `vocab` ids could decode, or longer than the limit, is not ours."""
        def fits(completions: list[Completion]) -> bool:
            return all(len(c.tokens) <= max_new_tokens and all(t < vocab for t in c.tokens) for c in completions)
        kept = {i: c for i, c in self.kept.get(key, {}).items() if i < prompts and fits(c)}
        if kept:
            print(f"{label}: {len(kept)} of {prompts} prompts kept from {self.path}; continuing",
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


def _kept_row(line: str | None) -> tuple[str, int, list[Completion]] | None:
    """(key, prompt index, completions) of one line, or None where it is torn or not of our shape."""
    try:
        row = parse_row(line)
    except ValueError:
        return None
    key, index, tokens, finish = row.get("key"), row.get("prompt"), row.get("tokens"), row.get("finish")
    shaped = (isinstance(key, str) and type(index) is int and index >= 0 and isinstance(tokens, list)
              and isinstance(finish, list) and len(tokens) == len(finish) > 0
              and all(f in FINISH_REASONS for f in finish)
              and all(isinstance(ids, list) and all(type(t) is int and t >= 0 for t in ids) for ids in tokens))
    if not shaped:
        return None
    return key, index, [Completion(tokens=ids, finish_reason=f) for ids, f in zip(tokens, finish)]
