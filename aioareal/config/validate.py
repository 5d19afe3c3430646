"""Checks that span several config sections (single-field checks live in schema.py)."""
from __future__ import annotations

from .limits import STEP_COMPLETIONS_MAX
from .schema import Config, check


def validate_cross_section(config: Config) -> None:
    g = config.generation
    check(g.num_slots == 0 or g.num_slots >= config.algo.group_size, "generation.num_slots",
          f"must hold at least one group (algo.group_size={config.algo.group_size}), got {g.num_slots}")
    a = config.algo
    check(a.batch_groups * a.group_size <= STEP_COMPLETIONS_MAX, "algo.batch_groups",
          f"x algo.group_size is {a.batch_groups * a.group_size:,} completions a step; at most "
          f"{STEP_COMPLETIONS_MAX:,} fit a machine's memory (a step holds all of them at once)")
