"""YAML read with bounds (docs/reliability.md#bounded-readers): config files, sweep files and a run's
config.yaml are small, so anything far past their size is refused before it is built.

`yaml.safe_load` runs no code, but it trusts a file's shape: nested aliases ("billion laughs")
make a 317-byte file stand for millions of values, which every later walk (a check, an error line,
a copy) expands; an alias to its own ancestor makes a cycle; nesting thousands deep ends in a
RecursionError. Here the composer counts its depth, and a document's size is counted with each
alias expanded (stopping as soon as it passes the bound) before any Python object is built.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, SequenceNode

from ..errors import UserError

MAX_DEPTH = 32
MAX_VALUES = 100_000  # values in a document, aliases expanded: a full config has a few hundred


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses documents nested deeper than MAX_DEPTH or expanding past MAX_VALUES."""

    depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_document(self, node: Node) -> Any:
        _count(node, [0], set(), 1)
        return super().construct_document(node)


def _count(node: Node, seen: list[int], path: set[int], depth: int) -> None:
    """Add `node`'s values, aliases expanded, to seen[0]; refuse a cycle, a count past MAX_VALUES or
    (aliases inside aliases) a depth past MAX_DEPTH."""
    seen[0] += 1
    if depth > MAX_DEPTH:
        raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels (aliases expanded)", node.start_mark)
    if seen[0] > MAX_VALUES:
        raise ComposerError(None, None, f"expands to more than {MAX_VALUES} values (nested aliases?)", node.start_mark)
    if not isinstance(node, (SequenceNode, MappingNode)):
        return
    if id(node) in path:
        raise ComposerError(None, None, "an alias refers to a value that contains it", node.start_mark)
    path.add(id(node))
    children = node.value if isinstance(node, SequenceNode) else [n for pair in node.value for n in pair]
    for child in children:
        _count(child, seen, path, depth + 1)
    path.discard(id(node))


def load_yaml_text(text: str, source: str) -> Any:
    """Parse one YAML document; a syntax error or a refused shape is a one-line UserError naming
    `source` and the line."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{source}{where}: not valid YAML ({problem})") from None


def load_yaml(path: Path) -> Any:
    """`load_yaml_text` of the file at `path` (UTF-8)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return load_yaml_text(text, str(path))
