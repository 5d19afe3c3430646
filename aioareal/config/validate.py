"""Checks that span several config sections (single-field checks live in schema.py)."""
from __future__ import annotations

from .schema import Config, check


def validate_cross_section(config: Config) -> None:
    g = config.generation
    check(g.num_slots == 0 or g.num_slots >= config.algo.group_size, "generation.num_slots",
          f"must hold at least one group (algo.group_size={config.algo.group_size}), got {g.num_slots}")
